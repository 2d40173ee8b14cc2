"""A Gemma 4 layer at batch 1 with int4 weights, as launches (`--chained-products`):
- "off": the decode program's launches (`kernels`, `attention_kernel`): q/k/v, the
  normed split-KV attention and its combine, o and the residual step, gate/up and its
  GELU gate, down, the per-layer gate and projection and their residual steps;
- "tail": the five products after attention as one launch whose programs wait on
  counters (`layer_tail`, `triton_chain.layer_tail_int4`);
- "layer": the whole layer as one such launch (`whole_layer`, `triton_chain.layer_int4`)
  where its attention runs at the products' warps, else the tail as one (`layer_applies`).

Why: a batch-1 decode step is about 300 launches of a few microseconds each, and each
launch boundary costs the drain of the kernel before and the ramp of the next, which a
dependent launch only partly hides (the products alone, chained, run at a fraction of
the copy bandwidth: `benchmarks/records/`). In one launch a stage's programs start while
the stage before still runs, stream their first weights, and begin as soon as the last
tile they read is stored. `benchmarks/stage_chain_h200.py` measures what a boundary
costs either way on plain products.

Measured on an H200, it is not so: a wait on a counter inside the launch costs more than
the dependent launch's boundary it replaces, and the served step is slower with either
form (`benchmarks/records/2026-12-05-h200-chained-products.md`). So it is off by default.

The chain uses, stage by stage, the block shape the pinned table names for that product
(`int4_tuning`), or `DEFAULT_TILE`; all stages of a launch run with one number of warps
(`WARPS`; a whole layer, its attention kernel's).
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch

from engines.pytorch import dependent_launch, kernels
from engines.pytorch.kernels import Weight

Int4 = tuple[torch.Tensor, torch.Tensor]
Int4Tail = tuple[Int4, Int4, Int4, Int4, Int4]
Int4Layer = tuple[Int4, Int4, Int4, Int4, Int4, Int4]
# (BLOCK_N, BLOCK_K, GROUP_SCALES, PREFETCH) where the pinned table has no entry.
DEFAULT_TILE = (8, 2048, True, False)
WARPS = 4
# The five products' names in the kernels' constexprs (O_TILE, ...).
STAGES = ("O", "GU", "D", "PG", "PP")
# (prologue, epilogue) of each stage, as `kernels` launches them alone.
STAGE_FORMS = (
    (kernels.PLAIN, kernels.RESIDUAL_AFTER),  # o
    (kernels.RMS_NORM_AFTER, kernels.GELU_PAIR),  # gate/up
    (kernels.PLAIN, kernels.NO_EPILOGUE),  # down
    (kernels.RESIDUAL, kernels.GELU_TIMES),  # per-layer gate
    (kernels.PLAIN, kernels.RESIDUAL_AFTER),  # per-layer projection
)


def layer_tail(
    attn: torch.Tensor,
    x: torch.Tensor,
    ple: torch.Tensor,
    weights: tuple[Weight, Weight, Weight, Weight, Weight],
    norms: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    layer_scalar: torch.Tensor,
    eps: float,
    fused: bool,
    chained: bool,
) -> torch.Tensor:
    """The layer's output row from the attention output `attn` and the residual row `x`:
    o, gate/up, down, the per-layer gate (times `ple`, the layer's per-layer input) and
    projection (times `layer_scalar`), with norms (post-attention, pre-feed-forward,
    post-feed-forward, post-per-layer). `chained` where `applies`: one launch."""
    if fused and chained and applies(x, weights):
        (wo, so), (wgu, sgu), (wd, sd), (wpg, spg), (wpp, spp) = cast("Int4Tail", weights)
        launch = _layer_tail_op if torch.compiler.is_compiling() else _launch
        return launch(
            attn.contiguous(), x.contiguous(), ple.contiguous(), layer_scalar, wo, so, wgu,
            sgu, wd, sd, wpg, spg, wpp, spp, *norms, eps,
        )  # fmt: skip
    w_o, w_gate_up, w_down, w_ple_gate, w_ple_proj = weights
    n_post_attn, n_pre_ff, n_post_ff, n_post_ple = norms
    x = kernels.linear_residual(attn, w_o, x, n_post_attn, None, eps, fused)
    act = kernels.gated_norm_linear(x, n_pre_ff, eps, w_gate_up, fused, post_scale=True)
    d = kernels.linear(act, w_down, fused)
    ple_act, x = kernels.residual_linear(
        x, d, n_post_ff, None, None, eps, w_ple_gate, fused, gate_times=ple
    )
    return kernels.linear_residual(ple_act, w_ple_proj, x, n_post_ple, layer_scalar, eps, fused)


def applies(x: torch.Tensor, weights: tuple[Weight, ...]) -> bool:
    """One launch serves one row on CUDA of int4 products that share a group size."""
    if x.shape[0] != 1 or x.device.type != "cuda":
        return False
    pairs = [w for w in weights if isinstance(w, tuple)]
    groups = {packed.shape[1] * 8 // scale.shape[1] for packed, scale in pairs}
    return len(pairs) == len(weights) and len(groups) == 1


@functools.cache
def counters(device: torch.device, layer: int) -> torch.Tensor:
    """The chain's counters (`triton_chain`) for one layer (`layer`: its first weight's
    address), zeroed once and again by each of its launches as it ends. One set a layer,
    not one a device as `kernels`' residual counter is: a launch draws tickets before it
    waits on the launch before (`griddepcontrol.wait`), and with dependent launches the
    next layer's launch may start while this one's last programs still count."""
    from engines.pytorch import triton_chain

    return torch.zeros(triton_chain.COUNTERS.value, dtype=torch.int32, device=device)


def stage_tiles(
    gpu: str | None, shapes: tuple[tuple[int, int], ...], group: int
) -> list[tuple[int, int, bool, bool]]:
    """Each of the five products' (BLOCK_N, BLOCK_K, GROUP_SCALES, PREFETCH) on `gpu` (a
    CUDA device's name; None: none): `pinned_tile` of its shape and form."""
    return [
        pinned_tile(gpu, n, k, prologue, epilogue, group)
        for (n, k), (prologue, epilogue) in zip(shapes, STAGE_FORMS, strict=True)
    ]


def pinned_tile(
    gpu: str | None, n: int, k: int, prologue: int, epilogue: int, group: int
) -> tuple[int, int, bool, bool]:
    """The pinned table's block shape for the product alone on `gpu` (epilogue 3 under
    its plain product's key, as the autotuner's prune reads it), else `DEFAULT_TILE`."""
    from engines.pytorch import int4_tuning

    if gpu is None:
        return DEFAULT_TILE
    keyed = 0 if epilogue == kernels.RESIDUAL_AFTER else epilogue
    key = int4_tuning.gemv_key(n, k, prologue, keyed, group)
    config = int4_tuning.pinned_config(gpu, "gemv_int4", key)
    if config is None:
        return DEFAULT_TILE
    meta = config.kwargs
    group_scales, prefetch = bool(meta["GROUP_SCALES"]), bool(meta.get("PREFETCH"))
    return meta["BLOCK_N"], meta["BLOCK_K"], group_scales, prefetch


def stage_shapes(hidden: int, attn: int, ff: int, ple: int) -> tuple[tuple[int, int], ...]:
    """(outputs, inputs) of each stage: o, gate/up (outputs a half: the gate's), down,
    the per-layer gate and projection."""
    return ((hidden, attn), (ff, hidden), (hidden, ff), (ple, hidden), (hidden, ple))


def _tail_plan(
    x: torch.Tensor, attn_width: int, ff: int, ple_width: int, group: int
) -> tuple[list[int], dict[str, Any], list[torch.Tensor]]:  # fmt: skip
    """The five products' tiles a stage, their block shapes as the kernels' constexprs, and
    the rows they write (o, x_attn, act, d, x_ff, ple_act, p, out)."""
    hidden = x.shape[-1]
    shapes = stage_shapes(hidden, attn_width, ff, ple_width)
    tiles = stage_tiles(_gpu(x), shapes, group)
    counts = [-(-n // tile[0]) for (n, _k), tile in zip(shapes, tiles, strict=True)]
    meta = {f"{name}_TILE": tile for name, tile in zip(STAGES, tiles, strict=True)}
    row = functools.partial(torch.empty, dtype=x.dtype, device=x.device)
    widths = (hidden, hidden, ff, hidden, hidden, ple_width, hidden, hidden)
    return counts, meta, [row(1, width) for width in widths]


def _gpu(x: torch.Tensor) -> str | None:
    from engines.pytorch import int4_tuning

    return int4_tuning.gpu_name() if x.device.type == "cuda" else None


def _launch(
    attn: torch.Tensor, x: torch.Tensor, ple: torch.Tensor, scalar: torch.Tensor,
    wo: torch.Tensor, so: torch.Tensor, wgu: torch.Tensor, sgu: torch.Tensor,
    wd: torch.Tensor, sd: torch.Tensor, wpg: torch.Tensor, spg: torch.Tensor,
    wpp: torch.Tensor, spp: torch.Tensor, n_post_attn: torch.Tensor, n_pre_ff: torch.Tensor,
    n_post_ff: torch.Tensor, n_post_ple: torch.Tensor, eps: float,
) -> torch.Tensor:  # fmt: skip
    from engines.pytorch import triton_chain

    attn_width, ff, ple_width = attn.shape[-1], wgu.shape[0] // 2, wpg.shape[0]
    group = attn_width // so.shape[1]
    counts, meta, rows = _tail_plan(x, attn_width, ff, ple_width, group)
    pdl = dependent_launch.enabled(x.device)
    triton_chain.layer_tail_int4[(sum(counts),)](
        attn, x, ple, scalar, wo, so, wgu, sgu, wd, sd, wpg, spg, wpp, spp,
        n_post_attn, n_pre_ff, n_post_ff, n_post_ple, *rows, counters(x.device, wo.data_ptr()),
        x.shape[-1], attn_width, ff, ple_width, eps, *counts,
        GROUP=group, PDL=pdl, num_warps=WARPS, num_stages=1, launch_pdl=pdl, **meta,
    )  # fmt: skip
    return rows[-1]


# The traced form (torch.compile) of the same launch; eager calls launch directly (the
# op's dispatch costs host time a call, as `kernels` measured).
_layer_tail_op = torch.library.custom_op("llm_serving_bench::layer_tail_int4", mutates_args=())(
    _launch
)


@_layer_tail_op.register_fake
def _layer_tail_shape(attn: torch.Tensor, x: torch.Tensor, *_rest: Any) -> torch.Tensor:
    return torch.empty_like(x)  # the layer's output row


def whole_layer(
    x: torch.Tensor,
    ple: torch.Tensor,
    weights: tuple[Weight, ...],
    norms: tuple[torch.Tensor, ...],
    layer_scalar: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    heads: int,
    writes_kv: bool,
    scale: float,
    eps: float,
) -> torch.Tensor:
    """The whole layer in one launch (`triton_chain.layer_int4`, where `layer_applies`):
    q/k/v (weights: q/k/v, o, gate/up, down, the per-layer gate and projection), the
    attention `attention_kernel.decode_attention_normed` makes (norms: input, q, k, then
    `layer_tail`'s four), its KV row written to slot 0 of the pools, then `layer_tail`."""
    (wqkv, sqkv), (wo, so), (wgu, sgu), (wd, sd), (wpg, spg), (wpp, spp) = cast(
        "Int4Layer", weights
    )
    n_in, n_q, n_k, n_post_attn, n_pre_ff, n_post_ff, n_post_ple = norms
    launch = _layer_op if torch.compiler.is_compiling() else _launch_layer
    return launch(
        x.contiguous(), ple.contiguous(), layer_scalar, wqkv, sqkv, n_in, n_q, n_k,
        cos.contiguous(), sin.contiguous(), positions, k_pool, v_pool, hidden, wo, so, wgu,
        sgu, wd, sd, wpg, spg, wpp, spp, n_post_attn, n_pre_ff, n_post_ff, n_post_ple, heads,
        writes_kv, scale, eps,
    )  # fmt: skip


def layer_applies(
    x: torch.Tensor, weights: tuple[Weight, ...], k_pool: torch.Tensor, v_pool: torch.Tensor
) -> bool:
    """`whole_layer` serves `applies`' rows and weights with `attention_kernel`'s normed
    kernel's pools, where its attention runs at the products' `WARPS`. A layer whose
    heads need more (512 wide: 8) runs its tail as one launch instead: the whole layer at 8
    warps holds one program an SM, and so a few KB of weights in flight an SM for its
    products (`benchmarks/records/2026-12-05-cpu-chain-registers.md`)."""
    from engines.pytorch import attention_kernel

    return (
        applies(x, weights)
        and attention_kernel.use_normed_kernel(x, k_pool, v_pool)
        and attention_kernel.partial_warps(k_pool.shape[-1]) == WARPS
    )


def _launch_layer(
    x: torch.Tensor, ple: torch.Tensor, scalar: torch.Tensor, wqkv: torch.Tensor,
    sqkv: torch.Tensor, n_in: torch.Tensor, n_q: torch.Tensor, n_k: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, k_pool: torch.Tensor,
    v_pool: torch.Tensor, hidden: torch.Tensor, wo: torch.Tensor, so: torch.Tensor,
    wgu: torch.Tensor, sgu: torch.Tensor, wd: torch.Tensor, sd: torch.Tensor,
    wpg: torch.Tensor, spg: torch.Tensor, wpp: torch.Tensor, spp: torch.Tensor,
    n_post_attn: torch.Tensor, n_pre_ff: torch.Tensor, n_post_ff: torch.Tensor,
    n_post_ple: torch.Tensor, heads: int, writes_kv: bool, scale: float, eps: float,
) -> torch.Tensor:  # fmt: skip
    from engines.pytorch import attention_kernel, triton_chain

    kv_heads, head_dim = k_pool.shape[1], k_pool.shape[-1]
    group_heads, kv_len = heads // kv_heads, hidden.shape[-1]
    block_l, blocks, block_g = attention_kernel.split(kv_len, group_heads)
    warps = attention_kernel.partial_warps(head_dim)
    attn_width, ff, ple_width = heads * head_dim, wgu.shape[0] // 2, wpg.shape[0]
    group, qkv_width = x.shape[-1] // sqkv.shape[1], wqkv.shape[0]
    qkv_tile = pinned_tile(_gpu(x), qkv_width, x.shape[-1], kernels.RMS_NORM_AFTER, 0, group)
    counts, meta, rows = _tail_plan(x, attn_width, ff, ple_width, group)
    qkv_tiles = -(-qkv_width // qkv_tile[0])
    partials = kv_heads * blocks * block_g
    part = torch.empty(partials, head_dim, dtype=torch.float32, device=x.device)
    top, total = (torch.empty(partials, dtype=torch.float32, device=x.device) for _ in "ab")
    qkv = torch.empty(1, qkv_width, dtype=x.dtype, device=x.device)
    attn = torch.empty(1, attn_width, dtype=x.dtype, device=x.device)
    k0, v0 = k_pool[0], v_pool[0]  # (KVH, capacity, D): row 0 is slot 0
    # The combine's blocks a pass as for the pools' whole capacity: one compiled launch a
    # kind of layer for every KV bucket, not one a bucket.
    combine_blocks = attention_kernel.combine_blocks(head_dim, -(-k0.shape[1] // block_l), warps)
    grid = qkv_tiles + kv_heads * blocks + heads + sum(counts)
    pdl = dependent_launch.enabled(x.device)
    triton_chain.layer_int4[(grid,)](
        x, ple, scalar, wqkv, sqkv, n_in, n_q, n_k, cos, sin, positions, k0, v0,
        hidden.reshape(-1).view(torch.uint8), wo, so, wgu, sgu, wd, sd, wpg, spg, wpp, spp,
        n_post_attn, n_pre_ff, n_post_ff, n_post_ple, qkv, part, top, total, attn, *rows,
        counters(x.device, wqkv.data_ptr()), qkv_width, kv_len, blocks,
        *attention_kernel.pool_strides(k0, v0), scale, x.shape[-1], attn_width, ff,
        ple_width, eps, qkv_tiles, *counts, HEADS=heads, KV_HEADS=kv_heads,
        GROUP_HEADS=group_heads, BLOCK_G=block_g, D=head_dim, BLOCK_L=block_l,
        BLOCK_S=combine_blocks,
        SCALED=scale != 1.0, WRITES_KV=writes_kv, GROUP=group, PDL=pdl,
        Q_TILE=qkv_tile, **meta, num_warps=warps, num_stages=1, launch_pdl=pdl,
    )  # fmt: skip
    return rows[-1]


_layer_op = torch.library.custom_op(
    "llm_serving_bench::layer_int4", mutates_args=("k_pool", "v_pool")
)(_launch_layer)


@_layer_op.register_fake
def _layer_shape(x: torch.Tensor, *_rest: Any) -> torch.Tensor:
    return torch.empty_like(x)  # the layer's output row
