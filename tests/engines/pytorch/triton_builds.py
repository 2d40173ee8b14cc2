"""Compiling the int4 kernels for a GPU target on a machine with none (Triton's front end,
the LLVM lowering and the bundled ptxas run without a device): shared by the sm_75, sm_89
and sm_90 build tests. The builder is the static-bounds benchmark's, with no launch's
specialization assumed."""

from __future__ import annotations

from benchmarks.int4_issue_bound import build_matmul_int4

__all__ = ["build_matmul_int4"]
