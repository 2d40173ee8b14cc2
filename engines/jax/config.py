"""The JAX engine's settings: one typed record, and the command line that fills it (the
PyTorch engine's flags where they apply, plus the bucket ladder)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_PORT = 8200
# XLA compiles one program on a few threads of its own, so up to 8 programs at once keep a
# large host busy; the default ladder's 27 programs are what time to /health waits on.
DEFAULT_COMPILE_THREADS = max(1, min(8, os.cpu_count() or 1))
ATTENTION_CHOICES = ("auto", "xla", "pallas")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return sizes


@dataclass(frozen=True)
class JaxEngineConfig:
    model: str = "random:tiny-gemma4"
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_running: int = 64
    max_model_len: int | None = None
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    prefill_buckets: tuple[int, ...] = (64, 256, 512)
    kv_buckets: tuple[int, ...] = (1024, 2048, 4096)
    batch_buckets: tuple[int, ...] = (1, 8)
    decode_steps: int = 16
    decode_attention: str = "auto"
    prefill_budget: int = 2048
    compile_threads: int = DEFAULT_COMPILE_THREADS
    log_level: str = "info"


def build_parser() -> argparse.ArgumentParser:
    d = JaxEngineConfig()
    p = argparse.ArgumentParser(
        prog="python -m engines.jax",
        description="The project's JAX engine (Gemma 4): OpenAI-compatible, continuous "
        "batching over fixed slots, every shape bucket compiled before /health answers.",
    )
    p.add_argument("--model", default=d.model, help="random:<name>, a local HF folder, or a hub id")
    p.add_argument("--served-model-name", default=None, help="name clients use (default: --model)")
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument(
        "--max-running", type=_positive, default=d.max_running, help="KV slots (decode batch)"
    )
    p.add_argument(
        "--max-model-len",
        type=_positive,
        default=None,
        help="prompt + output tokens per request (default: the model's, capped at 8192); "
        "the largest KV bucket",
    )
    p.add_argument(
        "--dtype", default=d.dtype, help="auto (bf16 on sm_80+, fp16 on older GPUs, fp32 on CPU), "
        "float32, bfloat16, float16"
    )
    p.add_argument("--device", default=d.device, help="auto, cpu, cuda, cuda:N")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of random:<name> weights")
    p.add_argument(
        "--prefill-buckets",
        type=_sizes,
        default=d.prefill_buckets,
        help="prompt chunk lengths compiled (comma-separated); the largest is the chunk size",
    )
    p.add_argument(
        "--kv-buckets",
        type=_sizes,
        default=d.kv_buckets,
        help="KV lengths compiled below --max-model-len (which is always one)",
    )
    p.add_argument(
        "--batch-buckets",
        type=_sizes,
        default=d.batch_buckets,
        help="decode batch sizes compiled below --max-running (which is always one)",
    )
    p.add_argument(
        "--decode-steps",
        type=_positive,
        default=d.decode_steps,
        help="greedy decode steps per device call while every running request is greedy "
        "(1: a call a step); tokens stream in groups of up to this many, and a new request "
        "waits for the call in flight (and the one queued behind it) before its prefill",
    )
    p.add_argument(
        "--decode-attention",
        default=d.decode_attention,
        choices=ATTENTION_CHOICES,
        help="decode attention: one Pallas kernel a layer (auto on an sm_80+ GPU) or XLA's "
        "own kernels (auto on a CPU and on sm_75)",
    )
    p.add_argument(
        "--prefill-budget",
        type=_positive,
        default=d.prefill_budget,
        help="prompt tokens prefilled between two decode steps at most",
    )
    p.add_argument(
        "--compile-threads",
        type=_positive,
        default=d.compile_threads,
        help="programs compiled at once (default: the CPU count, at most 8)",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def parse_args(argv: Sequence[str] | None = None) -> JaxEngineConfig:
    return JaxEngineConfig(**vars(build_parser().parse_args(argv)))
