"""The int4 kernels build for sm_89 (the L4 of the shipped G6 campaign) in bfloat16, on a
machine with no GPU, at every configuration the autotuner may choose there (no table pins
the L4): Ada has no wgmma, so the products compile to mma.sync, and the values in pairs
use bf16's paired fma (sm_80 and later). No L4 is lent here; this is what CI can check of
that path before a campaign runs it. Skipped where Triton is not installed."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engines.pytorch import int4_tuning, triton_int4  # noqa: E402
from tests.engines.pytorch.triton_builds import build_matmul_int4  # noqa: E402

L4 = GPUTarget("cuda", 89, 32)
L4_SHARED_BYTES = 99 << 10  # per block


@pytest.mark.parametrize("config", int4_tuning.MATMUL_INT4_CONFIGS, ids=str)
def test_matmul_int4_builds_for_sm89_in_bfloat16(config: triton.Config) -> None:
    compiled = build_matmul_int4(config, L4, "bf16")
    ptx = compiled.asm["ptx"]
    assert compiled.metadata.shared <= L4_SHARED_BYTES
    assert "mma.sync" in ptx and "wgmma" not in ptx
    assert ("fma.rn.bf16x2" in ptx) == bool(config.kwargs.get("PAIRS"))


def test_dequantize_builds_for_sm89_in_bfloat16() -> None:
    signature = {"wq_ptr": "*i32", "ws_ptr": "*bf16", "w_ptr": "*bf16", "N": "i32", "K": "i32"}
    constants = {"GROUP": 32, "BLOCK_N": 32, "BLOCK_K": 256, "PAIRS": True}
    source = ASTSource(
        fn=triton_int4.dequantize_int4,
        signature=signature | dict.fromkeys(constants, "constexpr"),
        constexprs=constants,
    )
    assert "fma.rn.bf16x2" in triton.compile(source, target=L4, options={}).asm["ptx"]
