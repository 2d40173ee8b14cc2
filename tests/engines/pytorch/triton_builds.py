"""Compiling the int4 kernels for a GPU target on a machine with none (Triton's front end,
the LLVM lowering and the bundled ptxas run without a device): shared by the sm_75 and
sm_90 build tests."""

from __future__ import annotations

from typing import Any

import triton
from triton.compiler import ASTSource

from engines.pytorch import triton_int4


def build_matmul_int4(config: triton.Config, target: Any, dtype: str) -> Any:
    """`matmul_int4` at `config`, activations and scales in `dtype` ("bf16", "fp16")."""
    signature = {name: f"*{dtype}" for name in ("x_ptr", "ws_ptr", "y_ptr")}
    signature |= {"wq_ptr": "*i32", "part_ptr": "*fp32", "count_ptr": "*i32"}
    signature |= dict.fromkeys(("M", "N", "K", "M_BUCKET"), "i32")
    constants = {"GROUP": 32, **config.kwargs}
    source = ASTSource(
        fn=triton_int4.matmul_int4.fn,
        signature=signature | dict.fromkeys(constants, "constexpr"),
        constexprs=constants,
    )
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    return triton.compile(source, target=target, options=options)
