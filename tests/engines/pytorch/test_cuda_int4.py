"""`cuda_int4`, the batch-1 int4 product on the tensor cores in CUDA C: which builds it
picks (on any host); that every form the decode program uses compiles for sm_80 and sm_90
(NVRTC: torch's, or the nvidia-cuda-nvrtc wheel the dev extras install); and on a GPU,
that the plain product matches dequantize-then-matmul as `gemv_int4` does, repeats bit for
bit, replays in a CUDA graph and is what `kernels.linear` runs for one bf16 row, and that
each fused form (`kernels`' entry points) is no further from its float32 torch form than
`gemv_int4`'s."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from benchmarks.int4_cuda_forms_h200 import FORMS as TIMED_FORMS
from benchmarks.int4_cuda_forms_h200 import form_operands, run_form
from engines.pytorch import cuda_int4, int4, kernels
from engines.pytorch.gemv_forms import (
    GELU_PAIR,
    NO_EPILOGUE,
    PLAIN,
    RESIDUAL,
    RESIDUAL_AFTER,
    RMS_NORM_AFTER,
)

# E2B's products at one row (N, K), as `benchmarks/gemv_h200.py` lists them.
E2B = [(2560, 1536), (1536, 2048), (1536, 6144), (1536, 12288), (256, 1536), (1536, 256)]
# The decode program's fused forms over E2B's shapes, as the forms benchmark times them:
# (prologue, epilogue, scalar, N, K).
FORMS = sorted(
    {(p, e, s, n, k) for _, p, e, s, n, k, _ in TIMED_FORMS if (p, e) != (PLAIN, NO_EPILOGUE)}
)


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
    text = cuda_int4.Build(2560, 1536, 12, RMS_NORM_AFTER, GELU_PAIR, True).source()
    assert not re.findall(r"__[A-Z_]+__", text.replace("__CUDA_ARCH__", ""))
    assert "#define SPLIT 12" in text and "#define PROLOGUE 5" in text
    assert "#define SCALE 1" in text and "#define N_ 2560" in text


def test_measured_forms_are_fused_builds_it_takes() -> None:
    for (prologue, epilogue, n, k), warps in cuda_int4.MEASURED_FORMS.items():
        assert (prologue, epilogue) != (PLAIN, NO_EPILOGUE)
        assert warps in cuda_int4.splits(k, 2 if epilogue == GELU_PAIR else 1)
        assert cuda_int4.form_split(prologue, epilogue, n, k) == warps
    assert cuda_int4.form_split(PLAIN, NO_EPILOGUE, 1536, 6144) == cuda_int4.split(1536, 6144)
    assert cuda_int4.form_split(PLAIN, RESIDUAL_AFTER, 1536, 2048) is None  # gemv_int4's


def test_every_served_form_is_one_the_forms_benchmark_times() -> None:
    timed = {(prologue, epilogue, n, k) for _, prologue, epilogue, _, n, k, _ in TIMED_FORMS}
    assert set(cuda_int4.MEASURED_FORMS) <= timed


def test_a_gelu_pair_takes_twice_the_warps_of_its_merged_weight() -> None:
    # gate/up: the plain product over its 12,288 merged rows measured 3 warps a block,
    # 4 chunks each; the pair's 6 warps a block take 2 chunks of both halves each.
    assert cuda_int4.split(6144, 1536, tiles=2) == 6
    assert cuda_int4.split(12288, 1536, tiles=2) == 12
    assert cuda_int4.splits(1536, tiles=2) == [2, 3, 4, 6, 12]


def test_a_cpu_row_is_not_served() -> None:
    packed, scale = int4.quantize(torch.randn(32, 256, dtype=torch.bfloat16), 32)
    assert cuda_int4.product_for(torch.randn(1, 256, dtype=torch.bfloat16), packed, scale) is None


def _nvrtc_loads() -> bool:
    try:
        cuda_int4.nvrtc_library()
    except (cuda_int4.BuildError, OSError):
        return False
    return True


@pytest.mark.skipif(not _nvrtc_loads(), reason="no NVRTC library loads here")
@pytest.mark.parametrize("arch", ["80", "90"])
def test_every_build_compiles(arch: str) -> None:
    builds = [cuda_int4.Build(n, k, cuda_int4.split(n, k)) for n, k in E2B]
    for prologue, epilogue, scalar, n, k in FORMS:
        split = cuda_int4.split(n, k, 2 if epilogue == GELU_PAIR else 1)
        builds.append(cuda_int4.Build(n, k, split, prologue, epilogue, scalar))
    for build in builds:
        assert cuda_int4.cubin(build.source(), arch)[:4] == b"\x7fELF", build


cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < cuda_int4.MEASURED_ON,
    reason="needs a CUDA device of compute capability 9.0 or later",
)


def _gemv_int4(run: Callable[[], Any]) -> Any:
    """`run()` with `gemv_int4` taking every product `cuda_int4` would."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cuda_int4, "product_for", lambda *args, **kwargs: None)
        return run()


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
    kernel = cuda_int4.product_for(x, packed, scale)
    assert kernel is not None
    want = (x.float() @ int4.dequantize(packed, scale, torch.float32).T).flatten()
    top = float(want.abs().max())
    got = kernel.product(x, packed, scale).float().flatten()
    triton = _gemv_int4(lambda: kernels.linear(x, (packed, scale))).float().flatten()
    assert float((got - want).abs().max()) / top < 1e-2
    assert float((got - want).abs().max()) <= 2 * float((triton - want).abs().max()) + 1e-3
    assert torch.equal(kernel.product(x, packed, scale).flatten(), got.to(torch.bfloat16))


@cuda
def test_kernels_linear_runs_it_and_a_cuda_graph_replays_it() -> None:
    x, packed, scale = _weight(1536, 6144, 7)
    eager = kernels.linear(x, (packed, scale))
    kernel = cuda_int4.product_for(x, packed, scale)
    assert kernel is not None
    assert torch.equal(eager, kernel.product(x, packed, scale))
    assert torch.equal(replayed(lambda: kernels.linear(x, (packed, scale))), eager)


def replayed(run: Callable[[], torch.Tensor]) -> torch.Tensor:
    """What `run()` returns when a CUDA graph captured it and replays it (run once before,
    off the capture, to warm)."""
    run()
    out: list[torch.Tensor] = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.append(run())
    graph.replay()
    torch.cuda.synchronize()
    return out[0]


@cuda
def test_rows_it_does_not_take_run_gemv_int4() -> None:
    x, packed, scale = _weight(256, 1536, 3)
    assert cuda_int4.product_for(x.half(), packed, scale) is None
    assert cuda_int4.product_for(torch.cat([x, x]), packed, scale) is None
    offset = torch.empty(1, 1537, device="cuda", dtype=torch.bfloat16)[:, 1:]
    offset.copy_(x)
    assert cuda_int4.product_for(offset, packed, scale) is None  # not 16-byte aligned
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


def _rand(*shape: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", generator=gen, dtype=torch.bfloat16) * scale


@cuda
@pytest.mark.parametrize(
    ("prologue", "epilogue", "scalar", "n", "k"),
    [*FORMS, (RMS_NORM_AFTER, GELU_PAIR, False, 100, 1024)],
)
def test_each_fused_form_is_as_close_to_torch_as_gemv_int4(
    prologue: int, epilogue: int, scalar: bool, n: int, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = torch.Generator(device="cuda").manual_seed(n + k + prologue)
    rows = 2 * n if epilogue == GELU_PAIR else n
    # Every form the kernel builds, served or not (`MEASURED_FORMS` picks where it runs),
    # at the split it is served with, else the plain product's rule.
    forced = cuda_int4.form_split(prologue, epilogue, n, k) or cuda_int4.split(
        n, k, 2 if epilogue == GELU_PAIR else 1
    )
    monkeypatch.setattr(cuda_int4, "form_split", lambda *args: forced)
    x = _rand(1, k, gen=gen, scale=3.0)
    weight = int4.quantize(_rand(rows, k, gen=gen, scale=k**-0.5), 32)
    o = form_operands(n, k, scalar, gen)
    o32 = {key: None if v is None else v.float() for key, v in o.items()}
    # The torch form over the dequantized weight in float32: what both kernels approximate.
    dense = int4.dequantize(*weight, torch.float32)
    want = run_form(prologue, epilogue, x.float(), dense, o32, False)
    got = run_form(prologue, epilogue, x, weight, o, True)
    triton = _gemv_int4(lambda: run_form(prologue, epilogue, x, weight, o, True))
    for ours, theirs, exact in zip(got, triton, want, strict=True):
        if ours is None or theirs is None or exact is None:
            continue
        top = float(exact.abs().max())
        err, triton_err = (float((t.float() - exact).abs().max()) for t in (ours, theirs))
        assert err / top < 2e-2, (err / top, triton_err / top)
        assert err <= 2 * triton_err + 2e-3 * top, (err / top, triton_err / top)
    # The same bits again, and the residual step's counter left at zero for the next.
    again = run_form(prologue, epilogue, x, weight, o, True)
    for first, second in zip(got, again, strict=True):
        assert (first is None and second is None) or torch.equal(first, second)
    assert int(kernels._residual_counter(x.device).item()) == 0


@cuda
def test_the_measured_forms_run_the_cuda_product_and_the_others_gemv_int4() -> None:
    gen = torch.Generator(device="cuda").manual_seed(5)
    served = {(p, e, n, k) for p, e, n, k in cuda_int4.MEASURED_FORMS}
    for prologue, epilogue, scalar, n, k in FORMS:
        rows = 2 * n if epilogue == GELU_PAIR else n
        x = _rand(1, k, gen=gen)
        packed, scale = int4.quantize(_rand(rows, k, gen=gen), 32)
        o = form_operands(n, k, scalar, gen)
        operands = cuda_int4.Operands(
            other=o["branch"] if prologue == RESIDUAL else o["res"], norm_weight=o["nw"],
            branch_norm=o["rw_in"] if prologue == RESIDUAL else o["rw_out"],
            scalar=o["scalar"], x_out=torch.empty_like(o["res"]), multiplier=o["m"],
            counter=kernels._residual_counter(x.device), eps=1e-6,
        )  # fmt: skip
        product = cuda_int4.product_for(x, packed, scale, prologue, epilogue, operands)
        if (prologue, epilogue, n, k) in served:
            assert product is not None, (prologue, epilogue, n, k)
            assert (product.build.prologue, product.build.epilogue) == (prologue, epilogue)
        else:
            assert product is None, (prologue, epilogue, n, k)
