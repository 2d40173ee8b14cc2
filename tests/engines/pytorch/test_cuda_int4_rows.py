"""`cuda_int4_rows`, the int4 product of 2 to 64 rows on the tensor cores in CUDA C: which
rows and shapes it takes (on any host); that each served build, and the benchmark's
search, compile for sm_80 and sm_90 (NVRTC); and on a GPU, that each served build, and
builds that mask rows or split the batch between warps, match dequantize-then-matmul as
`matmul_int4` does at full and partial row buckets, repeat bit for bit and leave their
counters at zero, and that a served build replays in a CUDA graph and is what
`kernels.linear` runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from engines.pytorch import cuda_int4, cuda_int4_rows, int4, kernels
from engines.pytorch.cuda_int4_rows import Build, Config
from tests.engines.pytorch.test_cuda_int4 import _nvrtc_loads, cuda, replayed

# Builds no E2B shape is: N not a whole block of rows, K split in two, two fragments a warp;
# then the rows split between the warps of a set of fragments, two ways and four.
MASKED = Build(1000, 1024, 2, Config(warps=4, split_k=2, stages=2, rw=2))
BATCH_SPLITS = (
    Build(1000, 1024, 4, Config(warps=4, split_k=2, stages=2, rw=2, batch_split=2)),
    Build(1000, 1024, 8, Config(warps=8, split_k=2, stages=2, rw=4, batch_split=4)),
)


def test_rows_fall_into_buckets_of_whole_tiles() -> None:
    buckets = {rows: cuda_int4_rows.tiles_for(rows) for rows in (2, 8, 9, 16, 17, 32, 33, 64)}
    assert buckets == {2: 1, 8: 1, 9: 2, 16: 2, 17: 4, 32: 4, 33: 8, 64: 8}


def test_a_configuration_name_reads_back() -> None:
    for build in (MASKED, *BATCH_SPLITS):
        assert Config.parse(build.config.name()) == build.config
    assert BATCH_SPLITS[1].config.name() == "w8_rw4_sk2_st2_bs4"
    assert Config.parse("w8_rw1_sk2_st3").batch_split == 1
    with pytest.raises(ValueError, match="not a configuration name"):
        Config.parse("w4_sk2")


def test_every_served_build_fits() -> None:
    for (tiles, n, k), config in cuda_int4_rows.measured().items():
        assert tiles in (1, 2, 4, 8)
        assert cuda_int4_rows.fits(Build(n, k, tiles, config)), (tiles, n, k, config)
    assert not cuda_int4_rows.fits(Build(1536, 1536, 1, Config(4, 8, 2)))  # 12 chunks by 8
    assert not cuda_int4_rows.fits(Build(1536, 1536, 1, Config(4, 1, 2, 1, 2)))  # 1 tile by 2
    assert not cuda_int4_rows.fits(Build(1536, 1536, 8, Config(2, 1, 2, 1, 4)))  # 2 warps by 4
    assert all(cuda_int4_rows.fits(build) for build in BATCH_SPLITS)


def test_the_source_takes_every_placeholder() -> None:
    text = MASKED.source()
    assert not re.findall(r"__[A-Z_]+__", text.replace("__CUDA_ARCH__", ""))
    assert "#define RW 2" in text and "#define SPLIT_K 2" in text and "#define N_ 1000" in text
    assert MASKED.blocks == (8, 2) and MASKED.threads == 128
    assert MASKED.partial_floats == 2 * 16 * 1000
    assert "#define BATCH_SPLIT 1" in text
    split = BATCH_SPLITS[1]
    assert "#define BATCH_SPLIT 4" in split.source()
    assert split.blocks == (8, 2) and split.threads == 256  # 16 * 4 * 8 / 4 rows a block


def test_cpu_rows_and_one_row_are_not_served() -> None:
    packed, scale = int4.quantize(torch.randn(32, 256, dtype=torch.bfloat16), 32)
    x = torch.randn(8, 256, dtype=torch.bfloat16)
    assert cuda_int4_rows.product_for(x, packed, scale) is None


class _Traced(Exception):
    """Raised by the test's backend: the trace reached it as one graph."""


@pytest.mark.parametrize("epilogue", [kernels.GELU_PAIR, kernels.GELU_TIMES])
def test_a_gated_product_traces_with_symbolic_rows(
    monkeypatch: pytest.MonkeyPatch, epilogue: int
) -> None:
    """The compiled decode program traces `kernels._gated_matmul` with symbolic rows once
    a second batch size is captured; which kernel takes the rows (`cuda_int4_rows` or
    `matmul_int4`) depends on their bucket, so it is asked inside the op at run time, and
    the trace holds one graph (fullgraph) whatever the table serves. A server once failed
    to start on the trace-time form. Traced only (the CPU runs no int4 kernel): the
    backend stops at the graph. Where the operands live is faked (this host has no GPU):
    the CPU's rows are taken as CUDA's, and the table's shapes as this device's."""
    monkeypatch.setattr(
        kernels, "_int4_rows", lambda x: x.numel() // x.shape[-1] <= kernels.INT4_MATMUL_MAX_ROWS
    )
    monkeypatch.setattr(cuda_int4, "operand_kinds_fit", lambda x, packed, scale: True)
    monkeypatch.setattr(cuda_int4, "device_fits", lambda index: True)
    packed, scale = int4.quantize(torch.randn(2 * 256, 1536, dtype=torch.bfloat16), 32)
    graphs: list[torch.fx.GraphModule] = []
    symbolic: list[bool] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[object]) -> object:
        graphs.append(gm)
        symbolic.append(any(isinstance(a, torch.SymInt) for a in example_inputs))
        raise _Traced

    @torch.compile(fullgraph=True, backend=backend, dynamic=True)
    def gated(x: torch.Tensor, multiplier: torch.Tensor) -> torch.Tensor:
        times = None if epilogue == kernels.GELU_PAIR else multiplier
        return kernels._gated_matmul(x, (packed, scale), epilogue, times)

    x = torch.randn(17, 1536, dtype=torch.bfloat16)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="_Traced"):
        gated(x, torch.randn(17, 2 * 256, dtype=torch.bfloat16))
    assert symbolic == [True]
    ops = [
        str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"
    ]
    assert any("matmul_int4" in op for op in ops), ops


@pytest.mark.skipif(not _nvrtc_loads(), reason="no NVRTC library loads here")
@pytest.mark.parametrize("arch", ["80", "90"])
def test_every_served_build_compiles(arch: str) -> None:
    builds = [Build(n, k, tiles, c) for (tiles, n, k), c in cuda_int4_rows.measured().items()]
    for build in [*builds, MASKED, *BATCH_SPLITS]:
        assert cuda_int4.cubin(build.source(), arch)[:4] == b"\x7fELF", build


@pytest.mark.skipif(not _nvrtc_loads(), reason="no NVRTC library loads here")
def test_the_benchmarks_search_builds() -> None:
    # benchmarks/int4_cuda_gemm_h200.py's search, a few of its builds for sm_90.
    from benchmarks import int4_cuda_gemm_h200 as gemm

    for n, k, rows in ((1536, 6144, 64), (2560, 1536, 17), (1536, 256, 8)):
        for config in gemm.configs(n, k, rows)[-2:]:
            build = Build(n, k, cuda_int4_rows.tiles_for(rows), config)
            assert cuda_int4.cubin(build.source(), "90")[:4] == b"\x7fELF"


def test_a_search_cut_short_keeps_the_entries_it_did_not_reach(tmp_path: Path) -> None:
    # benchmarks/int4_cuda_gemm_h200.py writes the served table after each shape.
    from benchmarks import int4_cuda_gemm_h200 as gemm

    table = tmp_path / "table.json"
    kept = {
        "4,1536,6144": "w8_rw1_sk8_st3",
        "4,8960,1536": "w4_rw2_sk3_st2",
        "1,256,1536": "w4_rw1_sk6_st2",
    }
    table.write_text(json.dumps({"measured_on": "earlier", "builds": kept}))
    # At 32 rows (4 tiles): one shape loses its entry, one gains one.
    shape = {"rows": 32, "N": 1536, "triton_us": 10.0}
    results = [
        shape | {"K": 6144, "cuda_us": 9.9, "cuda_config": "w8_rw1_sk4_st3"},
        shape | {"K": 4096, "cuda_us": 8.6, "cuda_config": "w8_rw2_sk8_st2_bs2"},
    ]
    served = gemm.served_table(results, table, "GPU")
    assert served == {
        "measured_on": "GPU",
        "builds": {"1,256,1536": "w4_rw1_sk6_st2", "4,1536,4096": "w8_rw2_sk8_st2_bs2",
                   "4,8960,1536": "w4_rw2_sk3_st2"},
    }  # fmt: skip


def _operands(rows: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) / k**0.5
    x = torch.randn(rows, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    return (x, *int4.quantize(w, 32))


def _matmul_int4(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cuda_int4_rows, "product_for", lambda *args: None)
        return kernels.linear(x, (packed, scale))


def _check(product: cuda_int4_rows.Product, rows: int, seed: int) -> None:
    build = product.build
    x, packed, scale = _operands(rows, build.n, build.k, seed)
    want = x.float() @ int4.dequantize(packed, scale, torch.float32).T
    top = float(want.abs().max())
    got = product(x, packed, scale)
    err = float((got.float() - want).abs().max())
    triton_err = float((_matmul_int4(x, packed, scale).float() - want).abs().max())
    assert err / top < 1e-2 and err <= 2 * triton_err + 1e-3 * top, (build, rows, err, triton_err)
    assert torch.equal(product(x, packed, scale), got)
    assert int(product.counters.abs().sum()) == 0


@cuda
@pytest.mark.parametrize("key", sorted(cuda_int4_rows.measured()))
def test_each_served_build_matches_dequantize_then_matmul(key: tuple[int, int, int]) -> None:
    tiles, n, k = key
    for rows in sorted({tiles * 8, max(2, tiles * 8 - 3)}):
        x, packed, scale = _operands(rows, n, k, 0)
        product = cuda_int4_rows.product_for(x, packed, scale)
        assert product is not None and product.build.config == cuda_int4_rows.measured()[key]
        _check(product, rows, n + k + rows)


@cuda
@pytest.mark.parametrize("build", [MASKED, *BATCH_SPLITS], ids=lambda b: b.config.name())
def test_a_masked_split_build(build: Build) -> None:
    device = torch.zeros(1, device="cuda").device  # the context the driver loads into
    product = cuda_int4_rows.loaded_product(device, build)
    assert product is not None
    full = build.tiles * 8
    for rows in sorted({2, 11, full - 5, full}):
        _check(product, rows, rows)


@cuda
def test_kernels_linear_runs_it_and_a_cuda_graph_replays_it() -> None:
    if not cuda_int4_rows.measured():
        pytest.skip("no shape is served")
    tiles, n, k = min(cuda_int4_rows.measured())
    x, packed, scale = _operands(tiles * 8, n, k, 3)
    product = cuda_int4_rows.product_for(x, packed, scale)
    assert product is not None
    eager = kernels.linear(x, (packed, scale))
    assert torch.equal(eager, product(x, packed, scale))
    assert torch.equal(replayed(lambda: kernels.linear(x, (packed, scale))), eager)


@cuda
def test_rows_it_does_not_take_run_matmul_int4() -> None:
    x, packed, scale = _operands(8, 1000, 1024, 1)  # a shape the table does not serve
    assert cuda_int4_rows.product_for(x, packed, scale) is None
    assert cuda_int4_rows.product_for(x[:1], packed, scale) is None
    assert cuda_int4_rows.product_for(x.half(), packed, scale) is None
