"""The batch-1 Triton kernels against their torch forms. Needs a CUDA device (skipped
elsewhere: CPU runs never reach the kernels, which `test_programs` checks)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from engines.pytorch import kernels

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _close(got: torch.Tensor, ref: torch.Tensor, rel: float) -> bool:
    return bool((got.float() - ref.float()).abs().max() <= rel * ref.float().abs().max())


@pytest.fixture
def tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen) * scale

    return {
        "x": rand(1, 1536, scale=3.0),
        "b": rand(1, 1536),
        "nw": rand(1536),
        "w": rand(2560, 1536, scale=1536**-0.5),
    }


def test_fused_projections_match_their_torch_forms(tensors: dict[str, torch.Tensor]) -> None:
    x, b, nw, w = tensors["x"], tensors["b"], tensors["nw"], tensors["w"]
    assert _close(kernels.linear(x, w), kernels.linear(x, w, fused=False), 1e-2)
    assert _close(
        kernels.norm_linear(x, nw, 1e-6, w, True), kernels.norm_linear(x, nw, 1e-6, w, False), 1e-2
    )
    assert _close(
        kernels.gelu_mul_linear(x, b, w, True), kernels.gelu_mul_linear(x, b, w, False), 1e-2
    )


def _gated_float32(x: torch.Tensor, nw: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    gate, up = (torch.rms_norm(x.float(), (x.shape[-1],), nw.float(), 1e-6) @ w.float().T).chunk(
        2, dim=-1
    )
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


def _error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("post_scale", [True, False])
def test_norm_scaled_after_the_product_and_gelu_epilogues_match_torch(
    tensors: dict[str, torch.Tensor], post_scale: bool
) -> None:
    x, b, nw, w = tensors["x"], tensors["b"], tensors["nw"], tensors["w"]
    assert _close(
        kernels.norm_linear(x, nw, 1e-6, w, True, post_scale=post_scale),
        kernels.norm_linear(x, nw, 1e-6, w, False),
        1e-2,
    )
    # A GELU gate times up multiplies two rounded products, so bf16 forms that round
    # at different places differ by a couple of output ulps: both are held to the
    # float32 result instead, the fused one no further from it than the torch one.
    got = kernels.gated_norm_linear(x, nw, 1e-6, w, True, post_scale=post_scale)
    assert got.shape == (1, w.shape[0] // 2)
    exact = _gated_float32(x, nw, w)
    unfused = _error(kernels.gated_norm_linear(x, nw, 1e-6, w, False), exact)
    assert _error(got, exact) <= max(2 * unfused, 1e-2)
    m = tensors["b"][:, :1].repeat(1, w.shape[0]) * 0.5
    got, got_x = kernels.residual_linear(x, b, nw, None, None, 1e-6, w, True, gate_times=m)
    ref, ref_x = kernels.residual_linear(x, b, nw, None, None, 1e-6, w, False, gate_times=m)
    assert torch.equal(got_x, ref_x)
    assert _close(got, ref, 2e-2)


@pytest.mark.parametrize("with_norm", [True, False])
def test_residual_projection_writes_the_same_residual_row(
    tensors: dict[str, torch.Tensor], with_norm: bool
) -> None:
    x, b, nw, w = tensors["x"], tensors["b"], tensors["nw"], tensors["w"]
    scalar = None if with_norm else torch.full((1,), 0.7, device="cuda", dtype=torch.bfloat16)
    norm = nw if with_norm else None
    got, got_x = kernels.residual_linear(x, b, nw, scalar, norm, 1e-6, w, True)
    ref, ref_x = kernels.residual_linear(x, b, nw, scalar, norm, 1e-6, w, False)
    assert torch.equal(got_x, ref_x)
    assert _close(got, ref, 1e-2)


@pytest.mark.parametrize("with_scalar", [False, True])
@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "int4"])
def test_a_residual_step_ending_the_product_writes_the_residual_row(
    tensors: dict[str, torch.Tensor], quantized: bool, with_scalar: bool
) -> None:
    from engines.pytorch import int4

    x, w = tensors["x"], tensors["w"]
    weight: kernels.Weight = int4.quantize(w, 32) if quantized else w
    gen = torch.Generator(device="cuda").manual_seed(1)
    residual, rw = (
        torch.randn(1, w.shape[0], device="cuda", dtype=torch.bfloat16, generator=gen) * 4,
        torch.randn(w.shape[0], device="cuda", dtype=torch.bfloat16, generator=gen),
    )
    scalar = torch.full((1,), 0.7, device="cuda", dtype=torch.bfloat16) if with_scalar else None
    # The same step in torch's form on the kernel's own product (times the identity,
    # exactly): another block shape may sum that product in another order, an ulp apart.
    identity = torch.eye(w.shape[0], device="cuda", dtype=torch.bfloat16)
    own = kernels.linear_residual(
        kernels.linear(x, weight), identity, residual, rw, scalar, 1e-6, False
    )
    bound = 2**-7 * (residual.float().abs() + own.float().abs())
    # Three launches in a row: the last program of each resets the counter.
    launches = [
        kernels.linear_residual(x, weight, residual, rw, scalar, 1e-6, True) for _ in range(3)
    ]
    assert bool(((launches[0].float() - own.float()).abs() <= bound).all())
    assert all(torch.equal(launch, launches[0]) for launch in launches[1:])
    assert int(kernels._residual_counter(x.device).item()) == 0


def test_batches_of_more_than_one_row_keep_cublas(tensors: dict[str, torch.Tensor]) -> None:
    rows = tensors["x"].repeat(4, 1)
    assert torch.equal(kernels.linear(rows, tensors["w"]), rows @ tensors["w"].T)


_TUNE_ONCE = """
import json, torch
from engines.pytorch import kernels, triton_kernels
x = torch.randn(1, 1536, device="cuda", dtype=torch.bfloat16)
w = torch.randn(2560, 1536, device="cuda", dtype=torch.bfloat16)
kernels.linear(x, w)
torch.cuda.synchronize()
tuner = triton_kernels.gemv
print(json.dumps({"timed": hasattr(tuner, "bench_time"), "config": str(tuner.best_config)}))
"""


def test_a_later_process_reuses_the_autotuners_choice(tmp_path: Any) -> None:
    import json
    import subprocess
    import sys

    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path)}
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", _TUNE_ONCE], env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0]["timed"] and not runs[1]["timed"]
    assert runs[1]["config"] == runs[0]["config"]
