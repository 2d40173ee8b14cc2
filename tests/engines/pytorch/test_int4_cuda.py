"""The int4 kernels' two ways of making values agree bit for bit on the GPU: values made
two at a time in 16-bit halves (`triton_int4._dequantized_pairs`, inline PTX the CPU
interpreter cannot run) against the float32 way, in `matmul_int4` and `dequantize_int4`,
and the dense weight that prefill multiplies equals the CPU's `int4.dequantize`."""

from __future__ import annotations

import pytest
import torch

from engines.pytorch import int4, kernels

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(params=[torch.bfloat16, torch.float16], ids=str)
def weight(request: pytest.FixtureRequest) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(384, 1024, device="cuda", generator=gen, dtype=request.param) / 32
    return int4.quantize(w, 32)


def test_dequantize_kernel_equals_the_cpu_form(weight: tuple[torch.Tensor, torch.Tensor]) -> None:
    packed, scale = weight
    want = int4.dequantize(packed.cpu(), scale.cpu(), scale.dtype)
    for pairs in (False, True):
        got = kernels._launch_dequantize_int4(packed, scale, scale.dtype, pairs=pairs)
        assert torch.equal(got.cpu(), want), pairs
    assert torch.equal(kernels.dense(weight, scale.dtype).cpu(), want)


def test_pairs_make_the_same_products(weight: tuple[torch.Tensor, torch.Tensor]) -> None:
    from engines.pytorch import triton_int4

    packed, scale = weight
    tuner = triton_int4.matmul_int4
    saved = tuner.configs, dict(tuner.cache)
    try:
        for rows in (3, 64):
            x = torch.randn(rows, packed.shape[1] * 8, device="cuda", dtype=scale.dtype)
            outputs = []
            for pairs in (False, True):
                config = triton_int4.config_from_label(
                    f"block_m=16,block_n=64,block_k=128,split_k=1,pairs={int(pairs)},w=4,s=3"
                )
                tuner.configs, tuner.cache = [config], {}
                outputs.append(kernels._launch_matmul_int4(x, packed, scale))
            assert torch.equal(outputs[0], outputs[1]), rows
    finally:
        tuner.configs, tuner.cache = saved[0], saved[1]
