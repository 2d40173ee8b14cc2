"""Triton's CPU interpreter (`TRITON_INTERPRET=1`) made to run the engine's kernels, for
the tests and the benchmarks' dry runs: the interpreter takes int() of a one-element
array for `range()` bounds passed at run time (`matmul_int4`'s split-K loop), which
NumPy 2 refuses. Call `fix()` before any kernel runs; it changes nothing on a GPU."""

from __future__ import annotations

from typing import Any


def fix() -> None:
    """Give the interpreter's tensors an `__index__` that returns their one element."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch
