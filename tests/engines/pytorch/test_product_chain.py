"""`product_chain`: a layer's five int4 products after attention (`tail`) and the whole
layer (`layer`) in one launch.

On the CPU, through Triton's interpreter (in a child process, this file its script, as
in `test_triton_interpreter`):
- the tail's launch gives, bit for bit, what the five `gemv_int4` launches give at the
  same block shapes (each stage several programs, chunks ragged against the rows, one
  stage prefetching), twice in a row (its counters reset), and the torch form within
  rounding;
- the whole layer's launch gives what its eight launches give (q/k/v, the normed
  attention kernel and its combine, the tail's five), with and without the KV write,
  the pools included;
- the decode program gives the same logits with `--chained-products` off, tail and
  layer, eager and compiled.
The interpreter runs programs one at a time in grid order: this checks the stages'
arithmetic and the counters' protocol, not concurrency. The launches also go through
Triton's own CUDA launch path on the CPU, to a stub H200 driver (`stub_cuda`); the CUDA
tests run them on a GPU.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import torch

from engines.pytorch import int4
from tests.engines.pytorch import interpreter_child, stub_cuda

pytest.importorskip("triton")

HIDDEN, ATTN, FF, PLE = 64, 96, 128, 32
# (BLOCK_N, BLOCK_K, GROUP_SCALES, PREFETCH) of o, gate/up, down, per-layer gate, projection.
TILES = [(16, 64, True, False), (16, 64, True, True), (8, 64, False, False),
         (8, 64, True, False), (16, 32, True, False)]  # fmt: skip


def test_the_decode_program_serves_the_same_logits_chained() -> None:
    result = interpreter_child.run(__file__, "program")
    assert result["launches"]["tail"] > 0 and result["launches"]["layer"] > 0, result
    assert all(result["same"].values()), result


def test_one_launch_computes_the_five_launches_products() -> None:
    result = interpreter_child.run(__file__)
    assert result["same"] == [True, True, True], result
    assert result["counters_reset"], result
    assert result["torch_error"] < 0.05, result
    for writes_kv, same in result["whole_layer"].items():
        assert all(same.values()), (writes_kv, same)


def _layer(dtype: Any) -> tuple[Any, ...]:
    import torch

    from engines.pytorch import int4

    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    shapes = ((HIDDEN, ATTN), (2 * FF, HIDDEN), (HIDDEN, FF), (PLE, HIDDEN), (HIDDEN, PLE))
    weights = tuple(int4.quantize(rand(n, k, scale=k**-0.5), 32) for n, k in shapes)
    norms = tuple(1.0 + rand(n, scale=0.1) for n in (HIDDEN, HIDDEN, HIDDEN, HIDDEN))
    attn, x, ple = rand(1, ATTN), rand(1, HIDDEN, scale=2.0), rand(1, PLE)
    return attn, x, ple, weights, norms, torch.full((1,), 0.7).to(dtype)


def _separate(
    attn: Any, x: Any, ple: Any, weights: Any, norms: Any, scalar: Any, attn_width: int = ATTN
) -> Any:
    """The five `gemv_int4` launches at `TILES`, as `kernels` makes them."""
    import torch
    import triton

    from engines.pytorch import kernels, triton_int4

    counter = torch.zeros(1, dtype=torch.int32)

    def launch(
        x_in: Any, w: Any, n: int, k: int, tile: Any, prologue: int, epilogue: int, **rows: Any
    ) -> Any:
        block_n, block_k, group_scales, prefetch = tile
        y = torch.empty(1, n, dtype=x_in.dtype)
        roles = [rows.get(name, x_in) for name in ("b", "nw", "rw", "s", "xo", "m")]
        triton_int4.gemv_int4.fn[(triton.cdiv(n, block_n),)](
            x_in, *roles, counter, *w, y, n, k, 1e-6, PROLOGUE=prologue,
            SCALE="s" in rows, EPILOGUE=epilogue, PDL=False, GROUP=32, BLOCK_N=block_n,
            BLOCK_K=block_k, GROUP_SCALES=group_scales, PREFETCH=prefetch, num_warps=4,
        )  # fmt: skip
        return y

    w_o, w_gu, w_d, w_pg, w_pp = weights
    n_post_attn, n_pre_ff, n_post_ff, n_post_ple = norms
    x_attn, x_ff, out = (torch.empty(1, HIDDEN, dtype=x.dtype) for _ in range(3))
    k3 = kernels.RESIDUAL_AFTER
    launch(attn, w_o, HIDDEN, attn_width, TILES[0], 0, k3, b=x, rw=n_post_attn, xo=x_attn)
    act = launch(x_attn, w_gu, FF, HIDDEN, TILES[1], kernels.RMS_NORM_AFTER,
                 kernels.GELU_PAIR, nw=n_pre_ff)  # fmt: skip
    d = launch(act, w_d, HIDDEN, FF, TILES[2], 0, 0)
    ple_act = launch(x_attn, w_pg, PLE, HIDDEN, TILES[3], kernels.RESIDUAL,
                     kernels.GELU_TIMES, b=d, rw=n_post_ff, xo=x_ff, m=ple)  # fmt: skip
    launch(ple_act, w_pp, HIDDEN, PLE, TILES[4], 0, k3, b=x_ff, rw=n_post_ple, s=scalar, xo=out)
    return out


def _child() -> dict[str, Any]:
    import torch

    from engines.pytorch import product_chain, triton_interpreter

    triton_interpreter.fix()
    attn, x, ple, weights, norms, scalar = _layer(torch.bfloat16)
    want = _separate(attn, x, ple, weights, norms, scalar)
    parts = [t for w in weights for t in w]
    same = []
    # The separate launches' tiles (the chain reads the pinned table's on a GPU).
    product_chain.stage_tiles = lambda gpu, shapes, group: TILES  # type: ignore[assignment]
    for _ in range(2):
        got = product_chain._launch(attn, x, ple, scalar, *parts, *norms, 1e-6)
        same.append(bool(torch.equal(got, want)))
    # The decode program's entry, its guard passed on the CPU.
    product_chain.applies = lambda x, weights: True  # type: ignore[assignment]
    got = product_chain.layer_tail(
        attn, x, ple, weights, norms, scalar, 1e-6, fused=True, chained=True
    )
    same.append(bool(torch.equal(got, want)))
    counters = product_chain.counters(torch.device("cpu"), parts[0].data_ptr())
    torch_form = product_chain.layer_tail(
        attn, x, ple, weights, norms, scalar, 1e-6, fused=False, chained=True
    )
    error = (got.float() - torch_form.float()).abs().max() / torch_form.float().abs().max()
    whole = {writes: _whole_layer_same(writes) for writes in (True, False)}
    return {
        "same": same,
        "counters_reset": not counters.any(),
        "torch_error": float(error),
        "whole_layer": whole,
    }


def _whole_layer_same(writes_kv: bool) -> dict[str, bool]:
    """`product_chain.whole_layer`'s launch against q/k/v's `gemv_int4` launch, the
    normed attention kernel and the tail's five launches, at the same tiles: the layer's
    row and the pools (the new key and value row where the layer writes KV), twice."""
    import torch

    from engines.pytorch import attention_kernel, int4, kernels, product_chain, triton_int4

    attn_unused, x, ple, tail, norms, scalar = _layer(torch.bfloat16)
    del attn_unused
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, head_dim, kv_len, length = 3, 1, ATTN // 3, 40, 37
    qkv_width = (heads + (2 * kv_heads if writes_kv else 0)) * head_dim
    w_qkv = int4.quantize((torch.randn(qkv_width, HIDDEN, generator=gen) / 8).bfloat16(), 32)
    n_in, n_q, n_k = (1.0 + torch.randn(n, generator=gen).bfloat16() * 0.1 for n in
                      (HIDDEN, head_dim, head_dim))  # fmt: skip
    angles = torch.randn(1, head_dim // 2, generator=gen) * 3
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).bfloat16() for f in (torch.cos, torch.sin))
    pools = torch.randn(2, 2, kv_heads, kv_len + 8, head_dim, generator=gen).bfloat16()
    hidden = (torch.arange(kv_len) > length - 1)[None, None, None, :]
    positions = torch.tensor([length - 1])
    qkv_tile = (16, 64, True, False)
    product_chain.pinned_tile = lambda *_form: qkv_tile  # type: ignore[assignment]
    # The separate launches, into their own copy of the pools.
    k_want, v_want = pools[0].clone(), pools[1].clone()
    qkv = torch.empty(1, qkv_width, dtype=torch.bfloat16)
    counter = torch.zeros(1, dtype=torch.int32)
    triton_int4.gemv_int4.fn[(qkv_width // qkv_tile[0],)](
        x, x, n_in, x, x, x, x, counter, *w_qkv, qkv, qkv_width, HIDDEN, 1e-6,
        PROLOGUE=kernels.RMS_NORM_AFTER, SCALE=False, EPILOGUE=0, PDL=False, GROUP=32,
        BLOCK_N=16, BLOCK_K=64, GROUP_SCALES=True, PREFETCH=False, num_warps=4,
    )  # fmt: skip
    attn = attention_kernel.decode_attention_normed(
        qkv,
        n_q,
        n_k,
        cos,
        sin,
        positions,
        k_want,
        v_want,
        hidden,
        heads,
        writes_kv,
        1.0,
        1e-6,
    ).reshape(1, -1)
    attn_norms = (n_in, n_q, n_k, *norms)
    want = _separate(attn, x, ple, tail, norms, scalar, attn.shape[-1])
    k_got, v_got = pools[0].clone(), pools[1].clone()
    same = {}
    for run in ("first", "again"):
        got = product_chain._launch_layer(
            x, ple, scalar, *w_qkv, *attn_norms[:3], cos, sin, positions, k_got, v_got,
            hidden, *[t for pair in tail for t in pair], *norms, heads, writes_kv, 1.0, 1e-6,
        )  # fmt: skip
        same[run] = bool(torch.equal(got, want))
    same["pools"] = bool(torch.equal(k_got, k_want) and torch.equal(v_got, v_want))
    same["counters"] = not product_chain.counters(torch.device("cpu"), w_qkv[0].data_ptr()).any()
    return same


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_one_launch_serves_graphs_as_the_five_launches_do() -> None:
    """E2B's shapes: the launch's row within rounding of the five launches' (its stages
    run 4 warps, theirs the pinned tables': the same sums in other orders), the same bits
    run after run, and in a CUDA graph replayed (its counters reset at each launch's end)."""
    from engines.pytorch import product_chain

    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden, attn_width, ff, ple_width = 1536, 2048, 6144, 256

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(torch.bfloat16)

    shapes = product_chain.stage_shapes(hidden, attn_width, ff, ple_width)
    shapes = ((hidden, attn_width), (2 * ff, hidden), *shapes[2:])
    weights = tuple(int4.quantize(rand(n, k, scale=k**-0.5), 32) for n, k in shapes)
    norms = tuple(1.0 + rand(hidden, scale=0.1) for _ in range(4))
    attn, x, ple = rand(1, attn_width), rand(1, hidden, scale=2.0), rand(1, ple_width)
    scalar = torch.full((1,), 0.7, device="cuda", dtype=torch.bfloat16)
    args = (attn, x, ple, weights, norms, scalar, 1e-6, True)
    want = product_chain.layer_tail(*args, chained=False)
    got = product_chain.layer_tail(*args, chained=True)
    error = float((got.float() - want.float()).abs().max() / want.float().abs().max())
    assert error < 1e-2, error
    assert torch.equal(product_chain.layer_tail(*args, chained=True), got)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = product_chain.layer_tail(*args, chained=True)
    for _ in range(3):
        replayed.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, got)


def test_a_layer_with_heads_512_wide_chains_its_tail_not_the_whole_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole layer in one launch only where its attention runs at the products' warps
    (a full layer's at 8 would hold one program an SM); the guards a CPU fails are passed."""
    from engines.pytorch import attention_kernel, product_chain

    monkeypatch.setattr(product_chain, "applies", lambda x, weights: True)
    monkeypatch.setattr(attention_kernel, "use_normed_kernel", lambda x, k, v: True)
    x = torch.zeros(1, 8)
    for head_dim, whole in ((256, True), (512, False)):
        pool = torch.zeros(2, 1, 1, 4, head_dim)
        assert product_chain.layer_applies(x, (), pool, pool) is whole, head_dim


# E2B's kinds of layer: (head_dim, ff, writes_kv): sliding and full, writing KV or
# reading an earlier layer's, the feed-forward single or double.
LAYER_KINDS = ((256, 6144, True), (256, 12288, False), (512, 6144, True), (512, 12288, False))


@pytest.mark.skipif(stub_cuda.compiler() is None, reason="no C compiler to build the stub driver")
def test_the_launches_pass_tritons_cuda_launcher_at_the_pinned_tiles(tmp_path: Any) -> None:
    """On a host with no GPU, through Triton's own launch path to a stub H200 driver
    (`stub_cuda`): the tail's launch and the whole layer's, at the tiles an H200 runs for
    each of E2B's kinds of layer, are accepted as the driver would (threads against their
    registers, dynamic shared memory), with no spills, one program a tile, as dependent
    launches; their PTX holds what only the compiler checks (the polls' inline asm, the
    counters' orderings)."""
    kinds, launches = stub_cuda.run(__file__, "launcher", tmp_path)
    assert len(launches) == 2 * len(LAYER_KINDS)
    for kind, tail, layer in zip(kinds, launches[::2], launches[1::2], strict=True):
        assert (tail.kernel, layer.kernel) == ("layer_tail_int4", "layer_int4")
        assert (tail.grid, layer.grid) == ((kind["tail_grid"], 1, 1), (kind["layer_grid"], 1, 1))
        assert (tail.threads, layer.threads) == (32 * kind["tail_warps"], 32 * kind["layer_warps"])
        for launch in (tail, layer):
            assert launch.dependent and launch.local_bytes == 0 and launch.regs > 0, launch
        assert all(kind["tail_ptx"].values()) and all(kind["layer_ptx"].values()), kind


def _launcher_child() -> list[dict[str, Any]]:
    """Each kind of layer's two launches with bfloat16 rows in host memory, as the engine
    makes them on the stub's H200: the grids and warps they should have, and their PTX."""
    import torch

    from engines.pytorch import (
        attention_kernel,
        dependent_launch,
        kernels,
        product_chain,
        triton_chain,
    )

    stub_cuda.as_h200()
    product_chain._gpu = lambda x: stub_cuda.GPU  # type: ignore[assignment]
    dependent_launch.enabled = lambda device: True  # type: ignore[assignment]
    gen = torch.Generator().manual_seed(0)
    heads, hidden, ple_width, kv_len, eps = 8, 1536, 256, 1024, 1e-6

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    def ptx(kernel: Any) -> dict[str, bool]:
        (text,) = stub_cuda.builds_ptx(kernel)  # one build a kind
        marks = {"wait": "griddepcontrol.wait", "sleeps": "nanosleep",
                 "acquire": "gpu.acquire.b32", "release": "gpu.release.add"}  # fmt: skip
        return {name: mark in text for name, mark in marks.items()}

    kinds = []
    for head_dim, ff, writes_kv in LAYER_KINDS:
        attn_width, qkv_width = heads * head_dim, (heads + (2 if writes_kv else 0)) * head_dim
        stages = product_chain.stage_shapes(hidden, attn_width, ff, ple_width)
        rows = [qkv_width, hidden, 2 * ff, hidden, ple_width, hidden]  # gate/up: both halves
        inputs = [hidden, attn_width, hidden, ff, hidden, ple_width]
        weights = [
            t for n, k in zip(rows, inputs, strict=True) for t in int4.quantize(rand(n, k), 32)
        ]
        norms = [rand(n) for n in (hidden, head_dim, head_dim, hidden, hidden, hidden, hidden)]
        x, ple, scalar = rand(1, hidden), rand(1, ple_width), rand(1)
        product_chain._launch(rand(1, attn_width), x, ple, scalar, *weights[2:], *norms[3:], eps)
        tail_ptx = ptx(triton_chain.layer_tail_int4)
        cos, sin, pools = rand(1, head_dim), rand(1, head_dim), rand(2, 2, 1, kv_len + 8, head_dim)
        hidden_mask = torch.zeros(1, 1, 1, kv_len, dtype=torch.bool)
        product_chain._launch_layer(
            x, ple, scalar, *weights[:2], *norms[:3], cos, sin, torch.tensor([kv_len - 1]),
            pools[0], pools[1], hidden_mask, *weights[2:], *norms[3:], heads, writes_kv, 1.0, eps,
        )  # fmt: skip
        tiles = product_chain.stage_tiles(stub_cuda.GPU, stages, 32)
        tail_grid = sum(-(-n // tile[0]) for (n, _k), tile in zip(stages, tiles, strict=True))
        qkv_tile = product_chain.pinned_tile(
            stub_cuda.GPU, qkv_width, hidden, kernels.RMS_NORM_AFTER, 0, 32
        )
        _block_l, blocks, _block_g = attention_kernel.split(kv_len, heads)
        kinds.append({
            "tail_grid": tail_grid,
            "layer_grid": -(-qkv_width // qkv_tile[0]) + blocks + heads + tail_grid,
            "tail_warps": product_chain.WARPS,
            "layer_warps": attention_kernel.partial_warps(head_dim),
            "tail_ptx": tail_ptx,
            "layer_ptx": ptx(triton_chain.layer_int4),
        })  # fmt: skip
    return kinds


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("head_dim", [256, 512])
def test_on_a_gpu_one_launch_serves_a_whole_layer_as_its_eight_launches_do(
    head_dim: int,
) -> None:
    """E2B's layer shapes (sliding and full): the whole layer's launch against q/k/v, the
    normed attention kernel and the tail's five launches, within rounding (its stages run
    one number of warps), the new key and value rows written alike, the same bits run
    after run and in a replayed CUDA graph."""
    from engines.pytorch import attention_kernel, kernels, product_chain

    gen = torch.Generator(device="cuda").manual_seed(0)
    heads, hidden, ff, ple_width, kv_len, length = 8, 1536, 6144, 256, 1024, 700

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(torch.bfloat16)

    shapes = [((heads + 2) * head_dim, hidden), (hidden, heads * head_dim), (2 * ff, hidden),
              (hidden, ff), (ple_width, hidden), (hidden, ple_width)]  # fmt: skip
    weights = tuple(int4.quantize(rand(n, k, scale=k**-0.5), 32) for n, k in shapes)
    norms = tuple(1.0 + rand(n, scale=0.1) for n in (hidden, head_dim, head_dim) + (hidden,) * 4)
    x, ple = rand(1, hidden, scale=2.0), rand(1, ple_width)
    scalar = torch.full((1,), 0.7, device="cuda", dtype=torch.bfloat16)
    angles = torch.randn(1, head_dim // 2, generator=gen, device="cuda") * 3
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).bfloat16() for f in (torch.cos, torch.sin))
    pools = rand(2, 2, 1, kv_len + 8, head_dim)
    hidden_mask = (torch.arange(kv_len, device="cuda") > length - 1)[None, None, None, :]
    positions = torch.tensor([length - 1], device="cuda")
    k_want, v_want = pools[0].clone(), pools[1].clone()
    qkv = kernels.norm_linear(x, norms[0], 1e-6, weights[0], True, post_scale=True)
    attn = attention_kernel.decode_attention_normed(
        qkv, norms[1], norms[2], cos, sin, positions, k_want, v_want, hidden_mask, heads,
        True, 1.0, 1e-6,
    ).reshape(1, -1)  # fmt: skip
    want = product_chain.layer_tail(
        attn, x, ple, weights[1:], norms[3:], scalar, 1e-6, True, chained=False
    )
    k_got, v_got = pools[0].clone(), pools[1].clone()
    args = (x, ple, weights, norms, scalar, k_got, v_got, cos, sin, hidden_mask, positions,
            heads, True, 1.0, 1e-6)  # fmt: skip
    got = product_chain.whole_layer(*args)
    error = float((got.float() - want.float()).abs().max() / want.float().abs().max())
    assert error < 2e-2, error
    for got_pool, want_pool in ((k_got, k_want), (v_got, v_want)):
        new_row = got_pool[0, :, length - 1].float()
        assert (new_row - want_pool[0, :, length - 1].float()).abs().max() < 5e-2
        got_pool[0, :, length - 1] = want_pool[0, :, length - 1]
        assert torch.equal(got_pool, want_pool)  # nothing else written
    assert torch.equal(product_chain.whole_layer(*args), got)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = product_chain.whole_layer(*args)
    for _ in range(3):
        replayed.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, got)


def _program_child() -> dict[str, Any]:
    """tiny-gemma4 with int4 decoder modules on the CPU (groups of 8: its per-layer width),
    decoding through the kernels in Triton's interpreter (the program keeps the torch
    forms on a CPU; the guards are opened here, as in `test_triton_interpreter`), with
    `--chained-products` off, tail and layer: the same logits, step by step, bit for bit
    (one block shape a product in every form; the attention kernels write the KV rows
    the next steps read)."""
    import torch

    from engines.pytorch import (
        attention_kernel,
        checkpoint,
        int4_tuning,
        kernels,
        product_chain,
        triton_int4,
        triton_interpreter,
    )
    from engines.pytorch.model import load_model
    from engines.pytorch.runner import ModelRunner

    triton_interpreter.fix()
    kernels._use_kernel = lambda fused, x, weight: fused and x.shape[0] == 1  # type: ignore[assignment]
    attention_kernel.use_kernel = lambda q, k_pool: q.shape[0] == 1  # type: ignore[assignment]
    product_chain.applies = lambda x, weights: (
        x.shape[0] == 1
        and all(  # type: ignore[assignment]
            isinstance(w, tuple) for w in weights
        )
    )
    # The tile the chain takes on a CPU, for the separate launches too.
    triton_int4.gemv_int4.configs = [
        int4_tuning.config_from_label("block_n=8,block_k=2048,group_scales=1,w=4,s=1")
    ]
    launches = {"tail": 0, "layer": 0}
    for name in launches:
        original = getattr(product_chain, "_launch" if name == "tail" else "_launch_layer")

        def counted(*args: Any, name: str = name, original: Any = original, **kw: Any) -> Any:
            launches[name] += 1
            return original(*args, **kw)

        setattr(product_chain, "_launch" if name == "tail" else "_launch_layer", counted)
    prompt = [257, *range(40, 70)]  # past tiny-gemma4's 16-token sliding window

    def decode(chained: str, compile_mode: str | None = None) -> list[torch.Tensor]:
        torch._dynamo.reset()
        loaded = load_model("random:tiny-gemma4", device="cpu", dtype="float32")
        checkpoint.quantize_model(loaded.model, group_size=8, int4_modules=True)
        runner = ModelRunner(
            loaded, num_slots=2, batch_invariant=False, batched_decode=True, fused_norms=True,
            decode_program=True, triton_gemv=True, attention_form="normed-kernel",
            chained_products=chained, compile_mode=compile_mode,
        )  # fmt: skip
        runner.prefill(0, prompt)
        return [
            runner.decode([0], [token], [len(prompt) + k]).clone()
            for k, token in enumerate(range(70, 74))
        ]

    same = {}
    # The server compiles each kind of layer (Inductor, C++ on a CPU): the launches are
    # then the custom ops', which write the pools in place; held to the compiled program
    # with separate launches (Inductor's own kernels round the embedding and head
    # differently from eager).
    for mode in (None, "default"):
        want = decode("off", mode)
        for chained in ("tail", "layer"):
            got = decode(chained, mode)
            for step, (g, w) in enumerate(zip(got, want, strict=True)):
                name = f"{chained}{' compiled' if mode else ''} step {step}"
                same[name] = bool(torch.equal(g, w))
    return {"launches": launches, "same": same}


if __name__ == "__main__":
    parts = {"program": _program_child, "launcher": _launcher_child}
    print(json.dumps(parts.get(sys.argv[1] if sys.argv[1:] else "", _child)()))
