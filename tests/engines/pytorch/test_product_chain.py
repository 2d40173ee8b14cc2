"""`product_chain`: a layer's five int4 products after attention in one launch, on the
CPU through Triton's interpreter. The launch gives, bit for bit, what the five
`gemv_int4` launches give at the same block shapes (each stage several programs, chunks
ragged against the rows, one stage prefetching), twice in a row (its counters reset), and
the torch form within rounding. The interpreter runs programs one at a time in grid
order: this checks the stages' arithmetic and the counters' protocol, not concurrency
(the CUDA tests run it on a GPU).

The interpreter runs in a child process (this file is its script), as in
`test_triton_interpreter`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from engines.pytorch import int4

pytest.importorskip("triton")

HIDDEN, ATTN, FF, PLE = 64, 96, 128, 32
# (BLOCK_N, BLOCK_K, GROUP_SCALES, PREFETCH) of o, gate/up, down, per-layer gate, projection.
TILES = [(16, 64, True, False), (16, 64, True, True), (8, 64, False, False),
         (8, 64, True, False), (16, 32, True, False)]  # fmt: skip


def test_one_launch_computes_the_five_launches_products() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["same"] == [True, True, True], result
    assert result["counters_reset"], result
    assert result["torch_error"] < 0.05, result


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


def _separate(attn: Any, x: Any, ple: Any, weights: Any, norms: Any, scalar: Any) -> Any:
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
    launch(attn, w_o, HIDDEN, ATTN, TILES[0], 0, k3, b=x, rw=n_post_attn, xo=x_attn)
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
    for _ in range(2):
        got = product_chain._launch(attn, x, ple, scalar, *parts, *norms, 1e-6, tiles=TILES)
        same.append(bool(torch.equal(got, want)))
    # The decode program's entry, its guard passed on the CPU, at the same tiles.
    product_chain.applies = lambda x, weights: True  # type: ignore[assignment]
    product_chain.stage_tiles = lambda gpu, shapes, group: TILES  # type: ignore[assignment]
    got = product_chain.layer_tail(
        attn, x, ple, weights, norms, scalar, 1e-6, fused=True, chained=True
    )
    same.append(bool(torch.equal(got, want)))
    counters = product_chain._counters(torch.device("cpu"))
    torch_form = product_chain.layer_tail(
        attn, x, ple, weights, norms, scalar, 1e-6, fused=False, chained=True
    )
    error = (got.float() - torch_form.float()).abs().max() / torch_form.float().abs().max()
    return {"same": same, "counters_reset": not counters.any(), "torch_error": float(error)}


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


@pytest.mark.parametrize(("ff", "attn"), [(6144, 2048), (12288, 4096)])
def test_the_launch_builds_for_sm90_at_the_pinned_tiles(ff: int, attn: int) -> None:
    """What only the compiler checks (the polls' inline asm, the counters' orderings, each
    stage's constexpr tile), on a machine with no GPU, at the tiles an H200 would run
    (E2B's sliding and full layers, the double-width feed-forward)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engines.pytorch import product_chain, triton_chain

    kernel = triton_chain.layer_tail_int4
    ints = ("HIDDEN", "ATTN", "FF", "PLE", "t0", "t1", "t2", "t3", "t4")
    packed = ("wo_ptr", "wgu_ptr", "wd_ptr", "wpg_ptr", "wpp_ptr", "counts_ptr")
    signature: dict[str, str] = {}
    for name in kernel.arg_names:
        if name.isupper() and name not in ints:
            signature[name] = "constexpr"
        elif name in ints:
            signature[name] = "i32"
        else:
            signature[name] = "fp32" if name == "eps" else ("*i32" if name in packed else "*bf16")
    tiles = product_chain.stage_tiles(
        "NVIDIA H200", product_chain.stage_shapes(1536, attn, ff, 256), 32
    )
    constants: dict[str, object] = {"GROUP": 32, "PDL": True}
    for stage, (block_n, block_k, group_scales, prefetch) in zip(
        ("O", "GU", "D", "PG", "PP"), tiles, strict=True
    ):
        constants |= {f"{stage}_BN": block_n, f"{stage}_BK": block_k}
        constants |= {f"{stage}_GS": group_scales, f"{stage}_PF": prefetch}
    # Pointers and widths as a launch specializes them (16-byte aligned, multiples of 16).
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, (name, kind) in enumerate(signature.items())
        if "*" in kind or name in ints[:4]
    }
    source = ASTSource(kernel, signature, constexprs=constants, attrs=aligned)
    options = {"num_warps": product_chain.WARPS, "num_stages": 1, "launch_pdl": True}
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    assert "griddepcontrol.wait" in ptx and "nanosleep" in ptx
    assert "gpu.acquire.b32" in ptx and "gpu.release.add" in ptx


if __name__ == "__main__":
    print(json.dumps(_child()))
