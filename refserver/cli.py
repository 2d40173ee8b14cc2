"""`python -m refserver`: flags -> `serve()`; prints `READY <port>` once listening."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from pathlib import Path

from refserver.protocol import ReferenceServerCore, serve
from refserver.truth import (
    DEFAULT_FAULT_AFTER,
    DEFAULT_FLAT_BATCH,
    DEFAULT_GT_MAX_CHUNKS,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MODEL,
    DEFAULT_STALL_S,
    USAGE_MODES,
    Pace,
)


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m refserver",
        description="Scripted OpenAI-compatible streaming server with per-chunk ground truth.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port; 0 picks a free one")
    p.add_argument("--ttft-ms", type=float, default=0.0, help="request parsed -> first token")
    p.add_argument("--itl-ms", type=float, default=0.0, help="gap between chunks; 0 = flat out")
    p.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens per chunk (default 1)")
    p.add_argument(
        "--usage-mode",
        choices=USAGE_MODES,
        default="separate",
        help="separate: own chunk if include_usage (vLLM); in_last_chunk: on the finish chunk, "
        "always (old llama.cpp); none",
    )
    p.add_argument("--reasoning-tokens", type=int, default=0, help="first K tokens as reasoning")
    p.add_argument("--role-chunk", action="store_true", help="send a role chunk first (vLLM)")
    p.add_argument(
        "--finish-on-last-token", action="store_true", help="finish_reason on the last token chunk"
    )
    p.add_argument(
        "--flat-batch",
        type=int,
        default=DEFAULT_FLAT_BATCH,
        help="flat out only: chunks per socket write, stamped alike (default 16)",
    )
    p.add_argument(
        "--fault-after",
        type=int,
        default=DEFAULT_FAULT_AFTER,
        help="token chunks before a badsse/disconnect/stall fault",
    )
    p.add_argument(
        "--stall-s",
        type=float,
        default=DEFAULT_STALL_S,
        help="how long FAULT:stall holds the connection",
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help="model name served")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=DEFAULT_MAX_MODEL_LEN,
        help="prompt + max_tokens above this is a 400, as vLLM words it",
    )
    p.add_argument("--log", type=Path, default=None, help="append ground truth JSONL here")
    p.add_argument(
        "--gt-max-chunks",
        type=int,
        default=DEFAULT_GT_MAX_CHUNKS,
        help="chunks kept in memory for GET /ground_truth (oldest dropped)",
    )
    p.add_argument("--cpu", type=int, default=None, help="pin to this CPU (sched_setaffinity)")
    p.add_argument("--log-level", default="WARNING", help="logging level on stderr")
    p.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="stop when stdin closes (the test helper uses it so no server outlives its test)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        pace = Pace(
            ttft_ms=args.ttft_ms,
            itl_ms=args.itl_ms,
            tokens_per_chunk=args.tokens_per_chunk,
            usage_mode=args.usage_mode,
            reasoning_tokens=args.reasoning_tokens,
            role_chunk=args.role_chunk,
            finish_on_last_token=args.finish_on_last_token,
            flat_batch=args.flat_batch,
            fault_after=args.fault_after,
            stall_s=args.stall_s,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    core = ReferenceServerCore(pace, args.model, args.max_model_len, args.log, args.gt_max_chunks)

    def ready(port: int) -> None:
        print(f"READY {port}", flush=True)

    # The server makes few long-lived objects; freezing them keeps GC passes short, which
    # keeps pacing jitter low.
    gc.freeze()
    coro = serve(args.host, args.port, core, ready, exit_on_stdin_eof=args.exit_on_stdin_eof)
    asyncio.run(coro)
    return 0
