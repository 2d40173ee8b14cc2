"""A Gemma 4 layer's products after attention, as the decode program runs them at batch 1
with `gemv_epilogues` (o and the residual step, gate/up and its GELU gate, down, the
per-layer gate and projection and their residual steps): five dependent launches of
`kernels`, or with `--product-chain on` and int4 weights, one launch whose programs wait
on counters (`triton_chain.layer_tail_int4`).

Why: a batch-1 decode step is about 300 launches of a few microseconds each, and each
launch boundary costs the drain of the kernel before and the ramp of the next, which a
dependent launch only partly hides (the products alone, chained, run at a fraction of
the copy bandwidth: `benchmarks/records/`). In one launch a stage's programs start while
the stage before still runs, stream their first weights, and begin as soon as the last
tile they read is stored. `benchmarks/stage_chain_h200.py` measures what a boundary
costs either way on plain products.

The chain uses, stage by stage, the block shape the pinned table names for that product
(`int4_tuning`), or `DEFAULT_TILE`; all stages run with `WARPS` warps.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch

from engines.pytorch import dependent_launch, kernels
from engines.pytorch.kernels import Weight

Int4 = tuple[torch.Tensor, torch.Tensor]
Int4Weights = tuple[Int4, Int4, Int4, Int4, Int4]
# (BLOCK_N, BLOCK_K, GROUP_SCALES, PREFETCH) where the pinned table has no entry.
DEFAULT_TILE = (8, 2048, True, False)
WARPS = 4
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
        (wo, so), (wgu, sgu), (wd, sd), (wpg, spg), (wpp, spp) = cast(Int4Weights, weights)
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
def _counters(device: torch.device) -> torch.Tensor:
    """The chain's counters (`triton_chain`), zeroed once and by every launch's end:
    launches run one after another on the stream, as `kernels`' residual counter's do."""
    from engines.pytorch import triton_chain

    return torch.zeros(triton_chain.COUNTERS.value, dtype=torch.int32, device=device)


def stage_tiles(
    gpu: str | None, shapes: tuple[tuple[int, int], ...], group: int
) -> list[tuple[int, int, bool, bool]]:
    """Each stage's (BLOCK_N, BLOCK_K, GROUP_SCALES, PREFETCH) on `gpu` (a CUDA device's
    name; None: none): the pinned table's entry for the product alone (epilogue 3 under
    its plain product's key, as the autotuner's prune reads it), else `DEFAULT_TILE`."""
    from engines.pytorch import int4_tuning

    tiles = []
    for (n, k), (prologue, epilogue) in zip(shapes, STAGE_FORMS, strict=True):
        config = None
        if gpu is not None:
            keyed = 0 if epilogue == kernels.RESIDUAL_AFTER else epilogue
            key = int4_tuning.gemv_key(n, k, prologue, keyed, group)
            config = int4_tuning.pinned_config(gpu, "gemv_int4", key)
        if config is None:
            tiles.append(DEFAULT_TILE)
            continue
        meta = config.kwargs
        tiles.append(
            (
                meta["BLOCK_N"],
                meta["BLOCK_K"],
                bool(meta["GROUP_SCALES"]),
                bool(meta.get("PREFETCH")),
            )
        )
    return tiles


def stage_shapes(hidden: int, attn: int, ff: int, ple: int) -> tuple[tuple[int, int], ...]:
    """(outputs, inputs) of each stage: o, gate/up (outputs a half: the gate's), down,
    the per-layer gate and projection."""
    return ((hidden, attn), (ff, hidden), (hidden, ff), (ple, hidden), (hidden, ple))


def _launch(
    attn: torch.Tensor, x: torch.Tensor, ple: torch.Tensor, scalar: torch.Tensor,
    wo: torch.Tensor, so: torch.Tensor, wgu: torch.Tensor, sgu: torch.Tensor,
    wd: torch.Tensor, sd: torch.Tensor, wpg: torch.Tensor, spg: torch.Tensor,
    wpp: torch.Tensor, spp: torch.Tensor, n_post_attn: torch.Tensor, n_pre_ff: torch.Tensor,
    n_post_ff: torch.Tensor, n_post_ple: torch.Tensor, eps: float,
    tiles: list[tuple[int, int, bool, bool]] | None = None,
) -> torch.Tensor:  # fmt: skip
    from engines.pytorch import triton_chain

    hidden, attn_width = x.shape[-1], attn.shape[-1]
    ff, ple_width = wgu.shape[0] // 2, wpg.shape[0]
    group = attn_width // so.shape[1]
    shapes = stage_shapes(hidden, attn_width, ff, ple_width)
    if tiles is None:
        from engines.pytorch import int4_tuning

        gpu = int4_tuning.gpu_name() if x.device.type == "cuda" else None
        tiles = stage_tiles(gpu, stage_shapes(hidden, attn_width, ff, ple_width), group)
    counts = [-(-n // tile[0]) for (n, _k), tile in zip(shapes, tiles, strict=True)]
    row = functools.partial(torch.empty, dtype=x.dtype, device=x.device)
    o, x_attn, d, x_ff, p, out = (row(1, hidden) for _ in range(6))
    act, ple_act = row(1, ff), row(1, ple_width)
    meta: dict[str, Any] = {}
    for name, (block_n, block_k, group_scales, prefetch) in zip(
        ("O", "GU", "D", "PG", "PP"), tiles, strict=True
    ):
        meta |= {f"{name}_BN": block_n, f"{name}_BK": block_k}
        meta |= {f"{name}_GS": group_scales, f"{name}_PF": prefetch}
    pdl = dependent_launch.enabled(x.device)
    triton_chain.layer_tail_int4[(sum(counts),)](
        attn, x, ple, scalar, wo, so, wgu, sgu, wd, sd, wpg, spg, wpp, spp,
        n_post_attn, n_pre_ff, n_post_ff, n_post_ple,
        o, x_attn, act, d, x_ff, ple_act, p, out, _counters(x.device),
        hidden, attn_width, ff, ple_width, eps, *counts,
        GROUP=group, PDL=pdl, num_warps=WARPS, num_stages=1, launch_pdl=pdl, **meta,
    )  # fmt: skip
    return out


@torch.library.custom_op("llm_serving_bench::layer_tail_int4", mutates_args=())
def _layer_tail_op(
    attn: torch.Tensor, x: torch.Tensor, ple: torch.Tensor, scalar: torch.Tensor,
    wo: torch.Tensor, so: torch.Tensor, wgu: torch.Tensor, sgu: torch.Tensor,
    wd: torch.Tensor, sd: torch.Tensor, wpg: torch.Tensor, spg: torch.Tensor,
    wpp: torch.Tensor, spp: torch.Tensor, n_post_attn: torch.Tensor, n_pre_ff: torch.Tensor,
    n_post_ff: torch.Tensor, n_post_ple: torch.Tensor, eps: float,
) -> torch.Tensor:  # fmt: skip
    return _launch(
        attn, x, ple, scalar, wo, so, wgu, sgu, wd, sd, wpg, spg, wpp, spp, n_post_attn,
        n_pre_ff, n_post_ff, n_post_ple, eps,
    )  # fmt: skip


@_layer_tail_op.register_fake
def _layer_tail_shape(
    attn: torch.Tensor, x: torch.Tensor, ple: torch.Tensor, scalar: torch.Tensor,
    wo: torch.Tensor, so: torch.Tensor, wgu: torch.Tensor, sgu: torch.Tensor,
    wd: torch.Tensor, sd: torch.Tensor, wpg: torch.Tensor, spg: torch.Tensor,
    wpp: torch.Tensor, spp: torch.Tensor, n_post_attn: torch.Tensor, n_pre_ff: torch.Tensor,
    n_post_ff: torch.Tensor, n_post_ple: torch.Tensor, eps: float,
) -> torch.Tensor:  # fmt: skip
    return torch.empty_like(x)
