"""`cuda_int4`, the batch-1 int4 product on the tensor cores in CUDA C: which builds it
picks (on any host); that its source compiles for sm_80 and sm_90 (NVRTC: torch's, or the
nvidia-cuda-nvrtc wheel the dev extras install); and on a GPU, that it matches
dequantize-then-matmul as `gemv_int4` does, repeats bit for bit, replays in a CUDA graph,
and is what `kernels.linear` runs for one bf16 row."""

from __future__ import annotations

import ctypes
import re

import pytest
import torch

from engines.pytorch import cuda_int4, int4, kernels

# E2B's products at one row (N, K), as `benchmarks/gemv_h200.py` lists them.
E2B = [(2560, 1536), (1536, 2048), (1536, 6144), (1536, 12288), (256, 1536), (1536, 256)]


def test_measured_splits_divide_their_rows_and_the_rule_fills_the_gpu() -> None:
    for (n, k), warps in cuda_int4.MEASURED_SPLITS.items():
        assert warps in cuda_int4.splits(k), (n, k)
        assert cuda_int4.split(n, k) == warps
    # Unmeasured: the fewest warps a block that give a launch 2,048 warps, else the most.
    assert cuda_int4.split(16 * 1024, 1536) == 2
    assert cuda_int4.split(64, 1536) == 12
    assert cuda_int4.splits(12288) == [8, 12, 16]
    assert not cuda_int4.shape_fits(64, 1000, 32) and not cuda_int4.shape_fits(64, 1024, 128)


def test_the_source_takes_every_placeholder() -> None:
    text = cuda_int4.source(1536, 12)
    assert not re.search(r"__(K|SPLIT|X_LOAD)__", text)
    assert "#define SPLIT 12" in text


def test_a_cpu_row_is_not_served() -> None:
    packed, scale = int4.quantize(torch.randn(32, 256, dtype=torch.bfloat16), 32)
    assert cuda_int4.kernel_for(torch.randn(1, 256, dtype=torch.bfloat16), packed, scale) is None


def _nvrtc_loads() -> bool:
    try:
        cuda_int4.nvrtc_library()
    except (cuda_int4.BuildError, OSError):
        return False
    return True


@pytest.mark.skipif(not _nvrtc_loads(), reason="no NVRTC library loads here")
@pytest.mark.parametrize("arch", ["80", "90"])
def test_every_build_compiles(arch: str) -> None:
    for n, k in E2B:
        image = cuda_int4.cubin(cuda_int4.source(k, cuda_int4.split(n, k)), arch)
        assert image[:4] == b"\x7fELF", (n, k)


cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < cuda_int4.MEASURED_ON,
    reason="needs a CUDA device of compute capability 9.0 or later",
)


def _weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) / k**0.5
    x = torch.randn(1, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    packed, scale = int4.quantize(w, 32)
    return x, packed, scale


@cuda
@pytest.mark.parametrize(("n", "k"), [*E2B, (100, 1024)])
def test_the_product_matches_dequantize_then_matmul_as_gemv_int4_does(n: int, k: int) -> None:
    x, packed, scale = _weight(n, k, n + k)
    kernel = cuda_int4.kernel_for(x, packed, scale)
    assert kernel is not None
    want = (x.float() @ int4.dequantize(packed, scale, torch.float32).T).flatten()
    top = float(want.abs().max())
    got = kernel.product(x, packed, scale).float().flatten()
    triton = kernels._launch(x, (packed, scale), prologue=kernels.PLAIN).float().flatten()
    assert float((got - want).abs().max()) / top < 1e-2
    assert float((got - want).abs().max()) <= 2 * float((triton - want).abs().max()) + 1e-3
    assert torch.equal(kernel.product(x, packed, scale).flatten(), got.to(torch.bfloat16))


@cuda
def test_kernels_linear_runs_it_and_a_cuda_graph_replays_it() -> None:
    x, packed, scale = _weight(1536, 6144, 7)
    eager = kernels.linear(x, (packed, scale))
    kernel = cuda_int4.kernel_for(x, packed, scale)
    assert kernel is not None
    assert torch.equal(eager, kernel.product(x, packed, scale))
    out: list[torch.Tensor] = []
    kernels.linear(x, (packed, scale))  # warm, off the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.append(kernels.linear(x, (packed, scale)))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0], eager)


@cuda
def test_rows_it_does_not_take_run_gemv_int4() -> None:
    x, packed, scale = _weight(256, 1536, 3)
    assert cuda_int4.kernel_for(x.half(), packed, scale) is None
    assert cuda_int4.kernel_for(torch.cat([x, x]), packed, scale) is None
    offset = torch.empty(1, 1537, device="cuda", dtype=torch.bfloat16)[:, 1:]
    offset.copy_(x)
    assert cuda_int4.kernel_for(offset, packed, scale) is None  # not 16-byte aligned
    got = kernels.linear(offset, (packed, scale)).float()
    want = x.float() @ int4.dequantize(packed, scale, torch.float32).T
    assert float((got - want).abs().max()) < 1e-2 * float(want.abs().max())


def test_ctypes_launch_records_match_the_drivers_layout() -> None:
    # cuda.h: CUlaunchAttribute is an id padded to 8 bytes and a 64-byte value union;
    # CUlaunchConfig seven unsigned ints, the stream, the attributes and their count.
    assert ctypes.sizeof(cuda_int4.LaunchAttribute) == 72
    assert cuda_int4.LaunchConfig.stream.offset == 32
    assert cuda_int4.LaunchConfig.attrs.offset == 40
    assert ctypes.sizeof(cuda_int4.LaunchConfig) == 56
