"""Batch-1 projections for the CUDA decode step: a Triton matrix-vector kernel with the
operation before the product fused into its loads, as torch custom ops, each with the
plain-torch form it replaces (which every other batch size and the CPU runs).

Why: at batch 1 every projection of Gemma 4 E2B is a matrix-vector product (0.8 to 75 MB
of weights). cuBLAS runs them as GEMM tiles at about half the copy bandwidth on the
smaller ones (`benchmarks/gemv_h200.py`: 2.00 ms for one step's projections on an H200,
against 1.60 ms for this kernel and a 1.10 ms roofline). And most are preceded by a small
kernel whose only consumer they are: the RMSNorm before q/k/v, gate/up and the LM head,
the GELU gate before down and the per-layer projection, the residual step before the
per-layer gate. Those take a few microseconds each.

`gemv(x, w, prologue)`: each program reduces `BLOCK_N` whole weight rows, read once and
coalesced in `BLOCK_K` chunks, with x rebuilt on the fly from its inputs:
- `linear`: x as given;
- `norm_linear`: RMSNorm(x) * norm_weight (each program recomputes the row's mean square:
  x is a few KB, read from L2);
- `gelu_mul_linear`: gelu_tanh(a) * b;
- `residual_linear`: x + RMSNorm(branch) * w [* scalar], optionally normed again, with
  the new residual row written out by the first program. Measured on an H200, this pays
  for a narrow projection (the per-layer gate: 4.9 vs 11.4 us) but not before a wide one
  (gate/up: every program rebuilds the row before it streams weights), so the decode
  program uses it only there.
Intermediates are rounded to the activation dtype where the unfused form rounds them, so
results stay within float32 summation-order differences of it. The configurations are
tried per (N, K) by Triton's autotuner the first time a shape runs.

Triton is imported only when a CUDA batch-1 call needs a kernel; CPU runs never touch it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

PLAIN, RMS_NORM, GELU_MUL, RESIDUAL, RESIDUAL_NORM = 0, 1, 2, 3, 4


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    configs = [
        triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
        for bn, bk, w, s in (
            (1, 1024, 4, 3),
            (2, 512, 4, 3),
            (2, 1024, 4, 3),
            (4, 512, 4, 3),
            (8, 256, 4, 3),
            (8, 512, 4, 3),
            (16, 256, 4, 3),
            (16, 128, 4, 4),
            (32, 128, 4, 4),
            (32, 256, 8, 3),
            (64, 128, 8, 3),
        )
    ]

    @triton.jit
    def _round(v, like_ptr):
        return v.to(like_ptr.dtype.element_ty).to(tl.float32)

    @triton.jit
    def _residual(x_ptr, b_ptr, rw_ptr, scalar, cols, col_ok, branch_rstd, SCALE: tl.constexpr):
        # x + RMSNorm(b) * rw [* scalar], rounded where the unfused ops round.
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        rw = tl.load(rw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        xn = _round(x + _round(b * branch_rstd * rw, x_ptr), x_ptr)
        if SCALE:
            xn = _round(xn * scalar, x_ptr)
        return xn

    @triton.jit
    def _input(
        x_ptr,
        b_ptr,
        nw_ptr,
        rw_ptr,
        scalar,
        cols,
        col_ok,
        rstd,
        branch_rstd,
        PROLOGUE: tl.constexpr,
        SCALE: tl.constexpr,
    ):
        if PROLOGUE >= 3:
            x = _residual(x_ptr, b_ptr, rw_ptr, scalar, cols, col_ok, branch_rstd, SCALE)
        else:
            x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if PROLOGUE == 1 or PROLOGUE == 4:
            nw = tl.load(nw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            x = _round(x * rstd * nw, x_ptr)
        elif PROLOGUE == 2:
            b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            tanh = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
            x = _round(_round(0.5 * x * (1.0 + tanh), x_ptr) * b, x_ptr)
        return x

    @triton.jit
    def _mean_square_rstd(x_ptr, K, eps, BLOCK_K: tl.constexpr):
        squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
            squares += x * x
        return 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)

    @triton.autotune(configs=configs, key=["N", "K", "PROLOGUE", "SCALE"])
    @triton.jit
    def gemv(
        x_ptr,
        b_ptr,
        nw_ptr,
        rw_ptr,
        s_ptr,
        xo_ptr,
        w_ptr,
        y_ptr,
        N,
        K,
        eps,
        PROLOGUE: tl.constexpr,
        SCALE: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        rstd = 1.0
        branch_rstd = 1.0
        scalar = 1.0
        if SCALE:
            scalar = tl.load(s_ptr).to(tl.float32)
        if PROLOGUE == 1:
            rstd = _mean_square_rstd(x_ptr, K, eps, BLOCK_K)
        if PROLOGUE >= 3:
            # Every program rebuilds the new residual row from L2 (a few KB); the first
            # also writes it out for the rest of the layer.
            branch_rstd = _mean_square_rstd(b_ptr, K, eps, BLOCK_K)
            squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                cols = k0 + tl.arange(0, BLOCK_K)
                col_ok = cols < K
                xn = _residual(x_ptr, b_ptr, rw_ptr, scalar, cols, col_ok, branch_rstd, SCALE)
                squares += xn * xn
                if pid == 0:
                    tl.store(xo_ptr + cols, xn.to(xo_ptr.dtype.element_ty), mask=col_ok)
            rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            col_ok = cols < K
            x = _input(
                x_ptr,
                b_ptr,
                nw_ptr,
                rw_ptr,
                scalar,
                cols,
                col_ok,
                rstd,
                branch_rstd,
                PROLOGUE,
                SCALE,
            )
            w = tl.load(
                w_ptr + rows[:, None] * K + cols[None, :],
                mask=row_ok[:, None] & col_ok[None, :],
                other=0.0,
                eviction_policy="evict_first",
            )
            acc += w.to(tl.float32) * x[None, :]
        tl.store(y_ptr + rows, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=row_ok)

    return triton, gemv


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    other: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    branch_norm: torch.Tensor | None = None,
    scalar: torch.Tensor | None = None,
    x_out: torch.Tensor | None = None,
    eps: float = 0.0,
    prologue: int,
) -> torch.Tensor:
    triton, kernel = _kernel()
    n, k = weight.shape
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    x = x.contiguous()
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
        x,
        x if other is None else other.contiguous(),
        x if norm_weight is None else norm_weight,
        x if branch_norm is None else branch_norm,
        x if scalar is None else scalar,
        x if x_out is None else x_out,
        weight,
        y,
        n,
        k,
        eps,
        PROLOGUE=prologue,
        SCALE=scalar is not None,
    )
    return y


@torch.library.custom_op("llm_serving_bench::gemv", mutates_args=())
def _gemv_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    other: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    prologue: int,
) -> torch.Tensor:
    return _launch(x, weight, other=other, norm_weight=norm_weight, eps=eps, prologue=prologue)


@_gemv_op.register_fake
def _gemv_shape(
    x: torch.Tensor,
    weight: torch.Tensor,
    other: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    prologue: int,
) -> torch.Tensor:
    return x.new_empty(1, weight.shape[0])


@torch.library.custom_op("llm_serving_bench::residual_gemv", mutates_args=())
def _residual_gemv_op(
    x: torch.Tensor,
    branch: torch.Tensor,
    branch_norm: torch.Tensor,
    scalar: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    x_new = torch.empty_like(x)
    y = _launch(
        x,
        weight,
        other=branch,
        norm_weight=norm_weight,
        branch_norm=branch_norm,
        scalar=scalar,
        x_out=x_new,
        eps=eps,
        prologue=RESIDUAL if norm_weight is None else RESIDUAL_NORM,
    )
    return y, x_new


@_residual_gemv_op.register_fake
def _residual_gemv_shape(
    x: torch.Tensor,
    branch: torch.Tensor,
    branch_norm: torch.Tensor,
    scalar: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(1, weight.shape[0]), torch.empty_like(x)


def _use_kernel(fused: bool, x: torch.Tensor, weight: torch.Tensor) -> bool:
    return fused and x.shape[0] == 1 and x.device.type == "cuda" and weight.is_contiguous()


def linear(x: torch.Tensor, weight: torch.Tensor, fused: bool = True) -> torch.Tensor:
    """x (rows, K) @ weight (N, K)^T."""
    if _use_kernel(fused, x, weight):
        return _gemv_op(x, weight, None, None, 0.0, PLAIN)
    return F.linear(x, weight)


def norm_linear(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor, fused: bool
) -> torch.Tensor:
    """RMSNorm(x) * norm_weight @ weight^T."""
    if _use_kernel(fused, x, weight):
        return _gemv_op(x, weight, None, norm_weight, eps, RMS_NORM)
    return F.linear(torch.rms_norm(x, (x.shape[-1],), norm_weight, eps), weight)


def gelu_mul_linear(
    a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor, fused: bool
) -> torch.Tensor:
    """(gelu_tanh(a) * b) @ weight^T."""
    if _use_kernel(fused, a, weight):
        return _gemv_op(a, weight, b, None, 0.0, GELU_MUL)
    return F.linear(F.gelu(a, approximate="tanh") * b, weight)


def residual_linear(
    x: torch.Tensor,
    branch: torch.Tensor,
    branch_norm: torch.Tensor,
    scalar: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    weight: torch.Tensor,
    fused: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual step and the next projection: x_new = (x + RMSNorm(branch) *
    branch_norm) [* scalar]; returns ([RMSNorm(x_new) * norm_weight | x_new] @ weight^T,
    x_new)."""
    if _use_kernel(fused, x, weight):
        return _residual_gemv_op(x, branch, branch_norm, scalar, norm_weight, weight, eps)
    x_new = x + torch.rms_norm(branch, (branch.shape[-1],), branch_norm, eps)
    if scalar is not None:
        x_new = (x_new * scalar).to(x_new.dtype)
    inputs = x_new
    if norm_weight is not None:
        inputs = torch.rms_norm(x_new, (x_new.shape[-1],), norm_weight, eps)
    return F.linear(inputs, weight), x_new
