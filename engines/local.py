"""The engine the embedded default (`bench run`) serves: llama.cpp on CPU, tiny model.

A stand-in for the full recipe table of issue 3, kept as data: the engine's name, how its
server is started, and the request extras it needs.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LOCAL_LLAMACPP", "LOCAL_LLAMACPP_EXTRA_BODY", "local_llamacpp_argv"]

LOCAL_LLAMACPP = "llamacpp"
# 8 slots of 2048 tokens: each holds the largest sweep shape (512 + 512) plus the template.
LOCAL_LLAMACPP_PARALLEL = 8
LOCAL_LLAMACPP_SLOT_CTX = 2048
# llama.cpp reuses a slot's cache around small prompt differences even with the nonce
# first (seed 002); turning prompt caching off keeps every prefill real.
LOCAL_LLAMACPP_EXTRA_BODY: dict[str, object] = {"cache_prompt": False}


def local_threads() -> int:
    """Leave a core for the load generator: on 2 cores, 1 thread served the tiny model at
    ~2,700 tok/s against 85-820 tok/s with 2 (measured while building this)."""
    return max(1, (os.cpu_count() or 2) - 1)


def local_llamacpp_argv(
    binary: Path, model: Path, port: int, *, threads: int | None = None
) -> list[str]:
    threads = threads or local_threads()
    return [
        str(binary),
        "--model", str(model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--parallel", str(LOCAL_LLAMACPP_PARALLEL),
        "--ctx-size", str(LOCAL_LLAMACPP_PARALLEL * LOCAL_LLAMACPP_SLOT_CTX),
        "--threads", str(threads),
        "--jinja",
        "--no-webui",
        "--metrics",
    ]  # fmt: skip
