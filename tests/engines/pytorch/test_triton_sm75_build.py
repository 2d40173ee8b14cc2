"""The int4 kernels build for sm_75 (the T4 of the shipped T4 campaign) with float16
activations, on a machine with no GPU, at every configuration the autotuner may choose
(Triton's front end, the LLVM lowering and the bundled ptxas run without a device). No
T4 is lent here, so this is what CI can check of that path before a campaign runs it.
Skipped where Triton is not installed."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engines.pytorch import int4_tuning, kernels, triton_int4  # noqa: E402
from tests.engines.pytorch.triton_builds import build_matmul_int4  # noqa: E402

T4 = GPUTarget("cuda", 75, 32)
T4_SHARED_BYTES = 64 << 10  # per block


def _signature(fn: object, count: int, ints: tuple[str, ...]) -> dict[str, str]:
    names = fn.arg_names[:count]  # type: ignore[attr-defined]
    kinds = {"wq_ptr": "*i32", "part_ptr": "*fp32", "count_ptr": "*i32", "eps": "fp32"}
    kinds |= dict.fromkeys(ints, "i32")
    return {name: kinds.get(name, "*fp16") for name in names}


@pytest.mark.parametrize("config", int4_tuning.GEMV_INT4_CONFIGS, ids=str)
def test_gemv_int4_builds_for_sm75_in_float16(config: triton.Config) -> None:
    signature = _signature(triton_int4.gemv_int4.fn, 14, ("N", "K"))
    # The heaviest forms: norm scaled after + gate/up pair, residual + GELU times, and
    # the residual step after the product.
    for prologue, epilogue in (
        (kernels.RMS_NORM_AFTER, kernels.GELU_PAIR),
        (kernels.RESIDUAL, kernels.GELU_TIMES),
        (kernels.PLAIN, kernels.RESIDUAL_AFTER),
    ):
        constants = {"PROLOGUE": prologue, "SCALE": False, "EPILOGUE": epilogue, "PDL": False}
        constants |= {"GROUP": 32, **config.kwargs}
        source = ASTSource(
            fn=triton_int4.gemv_int4.fn,
            signature=signature | dict.fromkeys(constants, "constexpr"),
            constexprs=constants,
        )
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        compiled = triton.compile(source, target=T4, options=options)
        assert compiled.metadata.shared <= T4_SHARED_BYTES


@pytest.mark.parametrize("config", int4_tuning.MATMUL_INT4_CONFIGS, ids=str)
def test_matmul_int4_builds_for_sm75_in_float16(config: triton.Config) -> None:
    compiled = build_matmul_int4(config, T4, "fp16")
    assert compiled.metadata.shared <= T4_SHARED_BYTES
    # Values in pairs: fp16's paired fma (sm_53 and later), not bf16's (sm_80 and later).
    assert ("fma.rn.f16x2" in compiled.asm["ptx"]) == bool(config.kwargs.get("PAIRS"))


@pytest.mark.parametrize("pairs", [False, True], ids=["float32 values", "values in pairs"])
def test_dequantize_builds_for_sm75_in_float16(pairs: bool) -> None:
    signature = _signature(triton_int4.dequantize_int4, 5, ("N", "K"))
    constants = {"GROUP": 32, "BLOCK_N": 32, "BLOCK_K": 256, "PAIRS": pairs}
    source = ASTSource(
        fn=triton_int4.dequantize_int4,
        signature=signature | dict.fromkeys(constants, "constexpr"),
        constexprs=constants,
    )
    ptx = triton.compile(source, target=T4, options={"num_warps": 4}).asm["ptx"]
    assert ("fma.rn.f16x2" in ptx) == pairs
