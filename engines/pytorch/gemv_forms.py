"""The codes of a batch-1 product's fused forms, written once: `kernels` picks them,
`triton_kernels` and `triton_int4` branch on them (as plain integers: Triton reads
constexprs) and `cuda_int4` substitutes them into its CUDA C.

Prologue (what builds the input as the product reads it): 0 plain, 1 RMSNorm before the
product, 2 GELU gate, 3 residual step, 4 residual step then RMSNorm, 5 RMSNorm scaled
after the product. Epilogue (what the results pass through before they are stored): 0
none, 1 GELU gate of a gate/up pair, 2 GELU gate times a vector, 3 residual step after
the product. What each computes, and why, is in `kernels`' docstring.
"""

from __future__ import annotations

PLAIN, RMS_NORM, GELU_MUL, RESIDUAL, RESIDUAL_NORM, RMS_NORM_AFTER = 0, 1, 2, 3, 4, 5
NO_EPILOGUE, GELU_PAIR, GELU_TIMES, RESIDUAL_AFTER = 0, 1, 2, 3
