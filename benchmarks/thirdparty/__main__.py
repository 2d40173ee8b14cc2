"""Smoke entry: `python -m benchmarks.thirdparty --url http://127.0.0.1:8000 --concurrency 64`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.thirdparty.aiperf import run_aiperf
from benchmarks.thirdparty.guidellm import run_guidellm
from benchmarks.thirdparty.records import ToolName


def _first_model(base_url: str) -> str:
    import httpx  # the project venv has it; imported here so the module loads without it

    resp = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=10)
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen tools once against ``--url`` and print a short summary each."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.thirdparty",
        description="Drive AIPerf and/or guidellm against an OpenAI-compatible server.",
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    p.add_argument("--tool", choices=["aiperf", "guidellm", "both"], default="both")
    p.add_argument("--concurrency", type=int, default=64, help="streams kept in flight")
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--requests", type=int, default=None, help="requests per run")
    p.add_argument("--duration", type=float, default=None, help="seconds per run")
    p.add_argument("--cpu", type=int, default=0, help="CPU to pin the tool to (-1: none)")
    p.add_argument("--out", type=Path, default=Path("results/thirdparty"), help="output root")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    model = args.model or _first_model(args.url)
    tools: list[ToolName] = ["aiperf", "guidellm"] if args.tool == "both" else [args.tool]
    runners = {"aiperf": run_aiperf, "guidellm": run_guidellm}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rc = 0
    for tool in tools:
        run = runners[tool](
            args.url,
            model,
            concurrency=args.concurrency,
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
            request_count=args.requests,
            duration_s=args.duration,
            out_dir=args.out / f"{stamp}-{tool}-c{args.concurrency}",
            cpu=None if args.cpu < 0 else args.cpu,
        )
        summary = run.summary()
        if args.json:
            print(json.dumps(summary))
        else:
            print(f"\n== {summary['tool']} at {args.concurrency} streams ({run.out_dir})")
            print("   " + " ".join(run.argv))
            for key, value in summary.items():
                if key != "tool":
                    print(f"   {key:28s} {_fmt(value)}")
        if run.returncode != 0 or run.requests_ok == 0:
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
