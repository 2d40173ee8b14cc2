"""Batch-1 projections for the CUDA decode step: a Triton matrix-vector kernel with the
operation before the product fused into its loads, as torch custom ops, each with the
plain-torch form it replaces (which every other batch size and the CPU runs).

Why: at batch 1 every projection of Gemma 4 E2B is a matrix-vector product (0.8 to 75 MB
of weights). cuBLAS runs them as GEMM tiles well below the copy bandwidth on the smaller
ones (`benchmarks/gemv_h200.py` measures both against the roofline; its figures are in
`benchmarks/records/`). And most are preceded by a small
kernel whose only consumer they are: the RMSNorm before q/k/v, gate/up and the LM head,
the GELU gate before down and the per-layer projection, the residual step before the
per-layer gate. Those take a few microseconds each.

`gemv(x, w, prologue, epilogue)`: each program reduces `BLOCK_N` whole weight rows, read
once and coalesced in `BLOCK_K` chunks, with x rebuilt on the fly from its inputs:
- `linear`: x as given;
- `norm_linear`: RMSNorm(x) * norm_weight. Either each program first recomputes the
  row's mean square (x is a few KB, read from L2) and rounds the normed row as
  torch.rms_norm does (`post_scale=False`), or it streams weights at once against
  x * norm_weight, sums the squares of the same x chunks on the way, and scales its
  results by the reciprocal RMS at the end (`post_scale=True`): no pass over x before
  the weights start, one rounding of the normed row fewer;
- `gelu_mul_linear`: gelu_tanh(a) * b;
- `residual_linear`: x + RMSNorm(branch) * w [* scalar], optionally normed again, with
  the new residual row written out by the first program. It pays for a narrow projection
  (the per-layer gate) but not before a wide one (gate/up: every program rebuilds the row
  before it streams weights), so the decode program uses it only there (measured:
  `benchmarks/records/`).
A GELU gate can also end the product that makes it instead of starting the one that
reads it (`epilogue`), so that product's programs recompute nothing per chunk:
- `gated_norm_linear`: gelu_tanh(gate) * up of a merged gate/up projection, each program
  reducing gate rows and the matching up rows, so down reads a finished activation;
- `residual_linear(..., gate_times=m)`: gelu_tanh(x_new @ w^T) * m (the per-layer gate
  times the per-layer input), so the per-layer projection does too.
A residual step after a product ends it too (`linear_residual`): x + RMSNorm(y) * w
[* scalar] needs the whole output row y, so the launch's last program to finish (a
counter, as `triton_int4.matmul_int4`'s split-K) reads y back and writes the new residual
row, in place of a kernel of its own after the product.
Intermediates are rounded to the activation dtype where the unfused form rounds them
(but for the normed row under `post_scale`), so results stay within float32 summation-order
differences of it, or a couple of output ulps of it for a gated product. What the epilogue
forms save is in `benchmarks/records/2026-11-29-h200-pytorch-epilogues.md`. The configurations are
tried per (N, K) by Triton's autotuner the first time a shape runs on a machine; the
timings are kept in Triton's disk cache, so later processes there reuse the choice.

Int4 weights (`int4`: the pair (packed, scale)) take the same entry points: at batch 1
`cuda_int4`'s CUDA C product on the tensor cores, with the forms the decode program uses,
where it serves (sm_90 and later), else `gemv_int4`, the same prologues and epilogues over
int4 rows in Triton; for 2 to 64 rows `cuda_int4_rows`' CUDA C product where it was
measured faster, else `matmul_int4`, the int4 tile dequantized in registers for the
tensor cores, with a deterministic split-K for narrow outputs (both in `triton_int4`);
where `matmul_int4` runs, the two GELU gates above end it there too (`_gated_matmul`):
gate/up's and the per-layer gate's, which cuBLAS leaves to a pointwise kernel after the
product; more rows (prefill) and
the CPU dequantize and run the dense product (on CUDA through
`triton_int4.dequantize_int4`, bit for bit the CPU's `int4.dequantize`). Measured against
bf16 and torch's own int4 kernel in `benchmarks/records/2026-12-0*-h200-int4*.md`.

Triton is imported only when a CUDA call needs a kernel; CPU runs never touch it.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, TypeAlias

import torch
import torch.nn.functional as F

from engines.pytorch import cuda_int4, cuda_int4_rows, dependent_launch
from engines.pytorch.gemv_forms import (
    GELU_MUL,
    GELU_PAIR,
    GELU_TIMES,
    NO_EPILOGUE,
    PLAIN,
    RESIDUAL,
    RESIDUAL_AFTER,
    RESIDUAL_NORM,
    RMS_NORM,
    RMS_NORM_AFTER,
)

log = logging.getLogger(__name__)

# A weight: dense (N, K), or int4 as (packed int32 (N, K/8), scale (N, K/group)) (`int4`).
Weight: TypeAlias = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
# Int4 products of this many rows at most run `triton_int4.matmul_int4`; more rows
# (prefill) dequantize the weight and run cuBLAS.
INT4_MATMUL_MAX_ROWS = 64


@functools.cache
def _kernel(name: str = "gemv") -> Any:
    if name.endswith("_int4"):
        from engines.pytorch import triton_int4

        return getattr(triton_int4, name)
    from engines.pytorch import triton_kernels

    return getattr(triton_kernels, name)


# Tiles a split-K int4 launch may count (`triton_int4.matmul_int4`): the LM head's
# output tiles at the narrowest block shape are fewer.
_SPLIT_COUNTERS = 1 << 18


@functools.cache
def _split_counters(device: torch.device) -> torch.Tensor:
    """One zeroed counter per tile for the split-K int4 kernel, shared by every launch on
    the device: launches run one after another on the stream (a dependent launch touches
    them only after its wait) and the last program of a tile resets its counter."""
    return torch.zeros(_SPLIT_COUNTERS, dtype=torch.int32, device=device)


@functools.cache
def _residual_counter(device: torch.device) -> torch.Tensor:
    """The counter of `linear_residual`'s launches (epilogue 3), shared by all of them on
    the device as `_split_counters` are: the last program of a launch resets it."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def counters_left_nonzero(device: torch.device) -> int:
    """How many of the shared launch counters are not zero once the device is idle. Each
    launch's last program resets its own, so any left over means a launch took a program
    for its last that was not, and read a partly written row."""
    torch.cuda.synchronize(device)
    counters = (_residual_counter(device), _split_counters(device))
    return sum(int(torch.count_nonzero(c)) for c in counters)


def _split_partials(
    configs: list, rows: int, bucket: int, n: int, k: int, group: int, device: torch.device
) -> torch.Tensor:
    """The float32 partial sums a split-K launch of `matmul_int4` writes: room for the
    largest split its configurations may run at this shape (`int4_tuning.largest_split`;
    one float where none splits, as the LM head's tiles never do)."""
    from engines.pytorch import int4_tuning

    split = int4_tuning.largest_split(configs, bucket, n, k, group)
    return torch.empty(split * rows * n if split > 1 else 1, dtype=torch.float32, device=device)


def _shape(weight: Weight) -> tuple[int, int]:
    if isinstance(weight, tuple):
        return weight[0].shape[0], weight[0].shape[1] * 8
    return weight.shape[0], weight.shape[1]


def _traced() -> bool:
    """Whether torch.compile is tracing the caller, which needs the custom ops below.
    Eager int4 calls (a prefill, whose time is mostly the host's) launch the kernels
    directly: the op's dispatch roughly doubled their host time a call (records:
    `2026-12-03-h200-int4-residual-epilogue.md`)."""
    return torch.compiler.is_compiling()


def dense(weight: Weight, dtype: torch.dtype) -> torch.Tensor:
    """The weight as a dense (N, K) matrix in `dtype` (int4: q * scale, the same bits on
    CUDA, through `triton_int4.dequantize_int4`, as on the CPU)."""
    if isinstance(weight, tuple):
        if weight[0].device.type == "cuda":
            if _traced():
                return _dequantize_int4_op(weight[0], weight[1], dtype)
            return _launch_dequantize_int4(weight[0], weight[1], dtype)
        from engines.pytorch import int4

        return int4.dequantize(weight[0], weight[1], dtype)
    return weight.to(dtype)


# One program dequantizes a (32, 256) tile: a copy-bound kernel, not tuned.
_DEQUANTIZE_BLOCK_N, _DEQUANTIZE_BLOCK_K = 32, 256


def _launch_dequantize_int4(
    packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, pairs: bool = True
) -> torch.Tensor:
    n, k = packed.shape[0], packed.shape[1] * 8
    w = torch.empty(n, k, dtype=dtype, device=packed.device)
    grid = (-(-n // _DEQUANTIZE_BLOCK_N), -(-k // _DEQUANTIZE_BLOCK_K))
    _kernel("dequantize_int4")[grid](
        packed,
        scale,
        w,
        n,
        k,
        GROUP=k // scale.shape[1],
        BLOCK_N=_DEQUANTIZE_BLOCK_N,
        BLOCK_K=_DEQUANTIZE_BLOCK_K,
        PAIRS=pairs,
    )
    return w


@torch.library.custom_op("llm_serving_bench::dequantize_int4", mutates_args=())
def _dequantize_int4_op(
    packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    return _launch_dequantize_int4(packed, scale, dtype)


@_dequantize_int4_op.register_fake
def _dequantize_int4_shape(
    packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    return packed.new_empty(packed.shape[0], packed.shape[1] * 8, dtype=dtype)


def int4_multiplies_dense(x: torch.Tensor) -> bool:
    """Whether an int4 product of x's rows, called eagerly, multiplies the dequantized
    weight (on the CPU, or more rows than `matmul_int4` takes): what lets a layer's
    products share one dequantize (`int4_blocks`)."""
    return not _traced() and not _int4_rows(x)


def _int4_rows(x: torch.Tensor) -> bool:
    return x.device.type == "cuda" and x.numel() // x.shape[-1] <= INT4_MATMUL_MAX_ROWS


def _matmul(x: torch.Tensor, weight: Weight) -> torch.Tensor:
    """x @ weight^T for any row count: int4 through `matmul_int4` for a few rows on CUDA,
    else through the dense weight."""
    if isinstance(weight, tuple) and _int4_rows(x):
        return _matmul_int4(x, weight)
    return F.linear(x, dense(weight, x.dtype))


def _matmul_int4(
    x: torch.Tensor,
    weight: tuple[torch.Tensor, torch.Tensor],
    epilogue: int = NO_EPILOGUE,
    multiplier: torch.Tensor | None = None,
) -> torch.Tensor:
    """x's rows through `matmul_int4` (its op where torch.compile traces the caller)."""
    rows = x.reshape(-1, x.shape[-1])
    launch = _matmul_int4_op if _traced() else _launch_matmul_int4
    times = None if multiplier is None else multiplier.reshape(rows.shape[0], -1)
    return launch(rows, weight[0], weight[1], epilogue, times).view(*x.shape[:-1], -1)


def _gated_matmul(
    x: torch.Tensor, weight: Weight, epilogue: int, multiplier: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ weight^T through a GELU gate: GELU_PAIR, gelu_tanh(gate) * up of its two
    halves; GELU_TIMES, gelu_tanh(.) * multiplier. Int4 rows go to `matmul_int4`'s op,
    which picks its kernel at run time: `matmul_int4` with the gate as its epilogue (one
    launch instead of the product and a pointwise kernel after it), or where
    `cuda_int4_rows` takes the rows (its products were measured faster), that product
    with the gate after it (`gelu_gate_int4`). The choice depends on the row bucket,
    which a compiled program's trace does not know (its rows are symbolic once a second
    batch size is captured). Dense weights: the product, then the gate."""
    if isinstance(weight, tuple) and _int4_rows(x):
        return _matmul_int4(x, weight, epilogue, multiplier)
    return _gate(_matmul(x, weight), epilogue, multiplier)


def _gate(y: torch.Tensor, epilogue: int, multiplier: torch.Tensor | None) -> torch.Tensor:
    """`_gated_matmul`'s GELU gate on a dense product y, in torch (F.gelu's output
    rounded, then the multiply's, as `matmul_int4`'s epilogue rounds)."""
    if epilogue == GELU_PAIR:
        gate, up = y.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up
    assert multiplier is not None, "GELU_TIMES multiplies by a tensor"
    return F.gelu(y, approximate="tanh") * multiplier


def matmul_int4_bucket(rows: int) -> int:
    """The row bucket `matmul_int4`'s autotuner keys its choice by (16, 32 or 64)."""
    return 16 if rows <= 16 else (32 if rows <= 32 else 64)


def _launch_matmul_int4(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    epilogue: int = NO_EPILOGUE,
    multiplier: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ dequantize(packed, scale)^T, passed through `matmul_int4`'s epilogue: GELU_PAIR
    (a merged gate/up weight: gelu_tanh(gate) * up, half the outputs) or GELU_TIMES
    (gelu_tanh(.) * multiplier, as wide as the product); where `cuda_int4_rows` serves
    the rows, its product with the gate after it (`gelu_gate_int4`)."""
    x = x.contiguous()
    # Asked here, at run time, where the tensors (and their addresses) are real.
    product = cuda_int4_rows.product_for(x, packed, scale)
    if product is not None:
        y = product(x, packed, scale)
        return y if epilogue == NO_EPILOGUE else _launch_gelu_gate_int4(y, epilogue, multiplier)
    m, k = x.shape
    n = packed.shape[0]
    y = torch.empty(m, n // 2 if epilogue == GELU_PAIR else n, dtype=x.dtype, device=x.device)
    multiplier = _multiplier_operand(multiplier, y)
    bucket = matmul_int4_bucket(m)
    kernel = _kernel("matmul_int4")
    group = k // scale.shape[1]
    kernel[lambda meta: (-(-m // meta["BLOCK_M"]), -(-n // meta["BLOCK_N"]), meta["SPLIT_K"])](
        x,
        packed,
        scale,
        y,
        _split_partials(kernel.configs, m, bucket, n, k, group, x.device),
        _split_counters(x.device),
        multiplier,
        m,
        n,
        k,
        bucket,
        multiplier.stride(0),
        GROUP=group,
        EPILOGUE=epilogue,
    )
    return y


def _multiplier_operand(multiplier: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """GELU_TIMES' multiplier as the int4 gates read it (unit stride along a row; its
    rows may be strided, as the per-layer inputs are), or `placeholder` where the gate
    has none: the kernels take a pointer either way."""
    if multiplier is None:
        return placeholder
    return multiplier if multiplier.stride(-1) == 1 else multiplier.contiguous()


# Outputs of a row a `gelu_gate_int4` program gates.
_GATE_BLOCK = 1024


def _launch_gelu_gate_int4(
    y: torch.Tensor, epilogue: int, multiplier: torch.Tensor | None
) -> torch.Tensor:
    """`matmul_int4`'s GELU epilogue (GELU_PAIR or GELU_TIMES) on a product y (rows,
    outputs) that ended without it: one launch, where F.gelu and the multiply were two."""
    rows, width = y.shape
    n = width // 2 if epilogue == GELU_PAIR else width
    out = torch.empty(rows, n, dtype=y.dtype, device=y.device)
    m = _multiplier_operand(multiplier, y)
    _kernel("gelu_gate_int4")[(rows, -(-n // _GATE_BLOCK))](
        y, m, out, n, y.stride(0), m.stride(0), PAIR=epilogue == GELU_PAIR, BLOCK=_GATE_BLOCK
    )
    return out


@torch.library.custom_op("llm_serving_bench::matmul_int4", mutates_args=())
def _matmul_int4_op(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    epilogue: int,
    multiplier: torch.Tensor | None,
) -> torch.Tensor:
    return _launch_matmul_int4(x, packed, scale, epilogue, multiplier)


@_matmul_int4_op.register_fake
def _matmul_int4_shape(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    epilogue: int,
    multiplier: torch.Tensor | None,
) -> torch.Tensor:
    return x.new_empty(x.shape[0], packed.shape[0] // (2 if epilogue == GELU_PAIR else 1))


def tuned_configs() -> dict[str, str]:
    """The configuration the autotuner chose for each (N, K, prologue, scale, epilogue, ...)
    key in this process; empty where no kernel ran. Recorded by the benchmarks, so a run's
    figures can be traced to the block shapes that made them."""
    module = sys.modules.get("engines.pytorch.triton_kernels")
    if module is None:
        return {}
    chosen = {}
    int4_module = sys.modules.get("engines.pytorch.triton_int4")
    for name in ("gemv", "gemv_int4", "matmul_int4"):
        prefix = "" if name == "gemv" else f"{name}:"
        owner = module if name == "gemv" else int4_module
        if owner is None:
            continue
        for key, config in getattr(owner, name).cache.items():
            chosen[prefix + ",".join(str(part) for part in key)] = str(config)
    return chosen


def _launch(
    x: torch.Tensor,
    weight: Weight,
    *,
    other: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    branch_norm: torch.Tensor | None = None,
    scalar: torch.Tensor | None = None,
    x_out: torch.Tensor | None = None,
    multiplier: torch.Tensor | None = None,
    eps: float = 0.0,
    prologue: int,
    epilogue: int = NO_EPILOGUE,
) -> torch.Tensor:
    pdl = dependent_launch.enabled(x.device)
    n, k = _shape(weight)
    if epilogue == GELU_PAIR:
        n //= 2
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    x = x.contiguous()
    other = None if other is None else other.contiguous()
    multiplier = None if multiplier is None else multiplier.contiguous()
    counter = _residual_counter(x.device)
    if isinstance(weight, tuple):
        # Asked here, at run time, where the tensors (and their addresses) are real.
        operands = cuda_int4.Operands(
            other, norm_weight, branch_norm, scalar, x_out, multiplier, counter, eps
        )
        product = cuda_int4.product_for(x, *weight, prologue, epilogue, operands)
        if product is not None:
            product(x, *weight, y, operands)
            return y
        kernel = _kernel("gemv_int4")
        weights: tuple[torch.Tensor, ...] = (*weight, y)
        extra: dict[str, int] = {"GROUP": k // weight[1].shape[1]}
    else:
        kernel, weights, extra = _kernel(), (weight, y), {}
    kernel[lambda meta: (-(-n // meta["BLOCK_N"]),)](
        x,
        x if other is None else other,
        x if norm_weight is None else norm_weight,
        x if branch_norm is None else branch_norm,
        x if scalar is None else scalar,
        x if x_out is None else x_out,
        x if multiplier is None else multiplier,
        counter,
        *weights,
        n,
        k,
        eps,
        PROLOGUE=prologue,
        SCALE=scalar is not None,
        EPILOGUE=epilogue,
        PDL=pdl,
        launch_pdl=pdl,
        **extra,
    )
    return y


@torch.library.custom_op("llm_serving_bench::gemv", mutates_args=())
def _gemv_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    other: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    prologue: int,
    epilogue: int,
) -> torch.Tensor:
    return _launch(
        x,
        weight if scale is None else (weight, scale),
        other=other,
        norm_weight=norm_weight,
        eps=eps,
        prologue=prologue,
        epilogue=epilogue,
    )


@_gemv_op.register_fake
def _gemv_shape(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    other: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    prologue: int,
    epilogue: int,
) -> torch.Tensor:
    return x.new_empty(1, weight.shape[0] // (2 if epilogue == GELU_PAIR else 1))


@torch.library.custom_op("llm_serving_bench::residual_gemv", mutates_args=())
def _residual_gemv_op(
    x: torch.Tensor,
    branch: torch.Tensor,
    branch_norm: torch.Tensor,
    scalar: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None,
    eps: float,
    gate_times: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    x_new = torch.empty_like(x)
    y = _launch(
        x,
        weight if weight_scale is None else (weight, weight_scale),
        other=branch,
        norm_weight=norm_weight,
        branch_norm=branch_norm,
        scalar=scalar,
        x_out=x_new,
        multiplier=gate_times,
        eps=eps,
        prologue=RESIDUAL if norm_weight is None else RESIDUAL_NORM,
        epilogue=NO_EPILOGUE if gate_times is None else GELU_TIMES,
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
    weight_scale: torch.Tensor | None,
    eps: float,
    gate_times: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(1, weight.shape[0]), torch.empty_like(x)


@torch.library.custom_op("llm_serving_bench::gemv_residual_after", mutates_args=())
def _gemv_residual_after_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None,
    residual: torch.Tensor,
    branch_norm: torch.Tensor,
    scalar: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    x_new = torch.empty_like(residual)
    _launch(
        x,
        weight if weight_scale is None else (weight, weight_scale),
        other=residual,  # epilogue 3 reads the residual row as the kernels' b
        branch_norm=branch_norm,
        scalar=scalar,
        x_out=x_new,
        eps=eps,
        prologue=PLAIN,
        epilogue=RESIDUAL_AFTER,
    )
    return x_new


@_gemv_residual_after_op.register_fake
def _gemv_residual_after_shape(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None,
    residual: torch.Tensor,
    branch_norm: torch.Tensor,
    scalar: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    return torch.empty_like(residual)


def _use_kernel(fused: bool, x: torch.Tensor, weight: Weight) -> bool:
    if isinstance(weight, tuple):
        return fused and x.shape[0] == 1 and x.device.type == "cuda"
    return fused and x.shape[0] == 1 and x.device.type == "cuda" and weight.is_contiguous()


def _parts(weight: Weight) -> tuple[torch.Tensor, torch.Tensor | None]:
    return weight if isinstance(weight, tuple) else (weight, None)


def linear(x: torch.Tensor, weight: Weight, fused: bool = True) -> torch.Tensor:
    """x (rows, K) @ weight (N, K)^T."""
    if _use_kernel(fused, x, weight):
        return _gemv_op(x, *_parts(weight), None, None, 0.0, PLAIN, NO_EPILOGUE)
    return _matmul(x, weight)


def norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: Weight,
    fused: bool,
    post_scale: bool = False,
) -> torch.Tensor:
    """RMSNorm(x) * norm_weight @ weight^T (`post_scale`: see the module docstring)."""
    if _use_kernel(fused, x, weight):
        prologue = RMS_NORM_AFTER if post_scale else RMS_NORM
        return _gemv_op(x, *_parts(weight), None, norm_weight, eps, prologue, NO_EPILOGUE)
    return _matmul(torch.rms_norm(x, (x.shape[-1],), norm_weight, eps), weight)


def gated_norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    gate_up: Weight,
    fused: bool,
    post_scale: bool = False,
) -> torch.Tensor:
    """gelu_tanh(gate) * up, where gate, up = RMSNorm(x) * norm_weight @ gate_up^T split
    in two halves: a merged gate/up projection with its GELU gate."""
    if _use_kernel(fused, x, gate_up):
        prologue = RMS_NORM_AFTER if post_scale else RMS_NORM
        return _gemv_op(x, *_parts(gate_up), None, norm_weight, eps, prologue, GELU_PAIR)
    return _gated_matmul(torch.rms_norm(x, (x.shape[-1],), norm_weight, eps), gate_up, GELU_PAIR)


def gelu_mul_linear(a: torch.Tensor, b: torch.Tensor, weight: Weight, fused: bool) -> torch.Tensor:
    """(gelu_tanh(a) * b) @ weight^T."""
    if _use_kernel(fused, a, weight):
        return _gemv_op(a, *_parts(weight), b, None, 0.0, GELU_MUL, NO_EPILOGUE)
    return _matmul(F.gelu(a, approximate="tanh") * b, weight)


def linear_residual(
    x: torch.Tensor,
    weight: Weight,
    residual: torch.Tensor,
    branch_norm: torch.Tensor,
    scalar: torch.Tensor | None,
    eps: float,
    fused: bool,
) -> torch.Tensor:
    """A projection and the residual step after it: (residual + RMSNorm(x @ weight^T) *
    branch_norm) [* scalar]. At batch 1 the product's last program does the step
    (epilogue 3), so it takes no kernel of its own."""
    if _use_kernel(fused, x, weight):
        return _gemv_residual_after_op(x, *_parts(weight), residual, branch_norm, scalar, eps)
    y = _matmul(x, weight)
    x_new = residual + torch.rms_norm(y, (y.shape[-1],), branch_norm, eps)
    if scalar is not None:
        x_new = (x_new * scalar).to(x_new.dtype)
    return x_new


def residual_linear(
    x: torch.Tensor,
    branch: torch.Tensor,
    branch_norm: torch.Tensor,
    scalar: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    weight: Weight,
    fused: bool,
    gate_times: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual step and the next projection: x_new = (x + RMSNorm(branch) *
    branch_norm) [* scalar]; returns ([RMSNorm(x_new) * norm_weight | x_new] @ weight^T,
    x_new), the product passed through gelu_tanh(.) * gate_times where that is given."""
    if _use_kernel(fused, x, weight):
        return _residual_gemv_op(
            x, branch, branch_norm, scalar, norm_weight, *_parts(weight), eps, gate_times
        )
    x_new = x + torch.rms_norm(branch, (branch.shape[-1],), branch_norm, eps)
    if scalar is not None:
        x_new = (x_new * scalar).to(x_new.dtype)
    inputs = x_new
    if norm_weight is not None:
        inputs = torch.rms_norm(x_new, (x_new.shape[-1],), norm_weight, eps)
    if gate_times is not None:
        return _gated_matmul(inputs, weight, GELU_TIMES, gate_times), x_new
    return _matmul(inputs, weight), x_new
