"""The project's JAX engine beside its PyTorch engine on one NVIDIA GPU (an H200), both
serving `random:gemma-4-e2b` in bf16, against issue 19's targets: batch 1 through the
server at least 40% of the roofline, 64 requests at least 10x batch 1, the first
completion within 1 s of health, prefill per token no worse than 1.5x PyTorch's, and
compile-to-ready within 3 minutes.

Sections, each recorded even if a later one fails (`result.json` is rewritten after each):
1. roofline: weight bytes a decode step streams over the device-to-device copy bandwidth
   measured in this run (torch);
2. per engine, one server at a time under the supervisor: launch to /health, then to the
   first completion; prefill ms per prompt token (the best of 3 one-token completions)
   at 128, 512 and 2,048 prompt tokens; then the project's sweep
   (`agent.loadgen.sweep.run_sweep`, greedy, forced output) at 1, 8 and 64 concurrent
   requests of 128 prompt and 512 output tokens, with the server's decode step time.

    python -m benchmarks.jax_vs_pytorch_h200 OUT_DIR [--engines jax,pytorch]
        [--jax-flags "FLAGS"] [--prefill-lens 128,512] [--no-roofline] [--model M]

(`--jax-flags` replaces the JAX server's flags below, for a shorter compile.)

Prints a table last; writes OUT_DIR/result.json, the sweeps' records and server logs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from agent.jobfolder import JobFolder
from agent.loadgen.client import OpenAIClient
from agent.loadgen.sweep import run_sweep
from agent.supervisor import EngineServer, free_port
from contract.results import CellResult
from contract.suite import RequestSettings, Shape, SweepSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "random:gemma-4-e2b"
LEVELS = (1, 8, 64)
PREFILL_LENS = (128, 512, 2048)
SERVER_FLAGS = {  # both engines as shipped (the JAX engine's default ladder: 27 programs)
    "jax": ("--max-model-len", "4096"),
    "pytorch": ("--max-model-len", "4096"),
}


def roofline(result: dict[str, Any]) -> None:
    import torch

    from engines.jax.model import spec_from_config, streamed_weight_count
    from engines.pytorch.stepbench import copy_bandwidth
    from engines.serving.random_models import RANDOM_MODELS
    from engines.serving.tokenizer import build_byte_tokenizer

    spec = spec_from_config(RANDOM_MODELS["gemma-4-e2b"].build_config(build_byte_tokenizer()))
    weight_bytes = 2 * streamed_weight_count(spec)
    bandwidth = copy_bandwidth(torch.device("cuda"), 1 << 31)
    torch.cuda.empty_cache()
    step_ms = 1e3 * weight_bytes / bandwidth
    result["roofline"] = {
        "gpu": torch.cuda.get_device_name(),
        "weight_bytes": weight_bytes,
        "copy_bytes_per_s": bandwidth,
        "step_ms": step_ms,
        "tok_s": 1e3 / step_ms,
    }


_SAMPLE = re.compile(r"^[a-z]+_engine_(\w+?)(?:\{([^}]*)\})? (\S+)$")


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10.0, trust_env=False).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = m.group(2) or ""
        if "le=" in labels:
            continue
        phase = re.search(r'phase="(\w+)"', labels)
        key = f"{m.group(1)}:{phase.group(1)}" if phase else m.group(1)
        values[key] = values.get(key, 0.0) + float(m.group(3))
    return values


def one_completion_s(client: httpx.Client, prompt: list[int], max_tokens: int) -> float:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    resp = client.post("/v1/completions", json=body)
    elapsed = time.perf_counter() - t0
    resp.raise_for_status()
    return elapsed


def engine_run(
    engine: str, out: Path, result: dict[str, Any], save: Any, flags: Sequence[str]
) -> None:
    model = result["model"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", f"engines.{engine}", "--model", model, "--port", str(port)]
    argv += ["--max-running", str(max(LEVELS)), *flags]
    mine: dict[str, Any] = {"argv": argv[1:], "cells": {}}
    result[engine] = mine
    t0 = time.monotonic()
    log_path = out / f"{engine}-server.log"
    with EngineServer(engine, argv, log_path=log_path, port=port, cwd=REPO_ROOT) as srv:
        srv.wait_healthy(f"{url}/health", 420)
        mine["health_s"] = time.monotonic() - t0
        prompt = [ord("a") + i % 26 for i in range(20)]
        with httpx.Client(base_url=url, timeout=300.0, trust_env=False) as client:
            first = one_completion_s(client, prompt, 16)
            mine["first_completion_after_health_s"] = first
            mine["first_completion_s"] = time.monotonic() - t0
            save()
            prefill: dict[str, float] = {}
            for n in result["prefill_lens"]:
                ids = [0x20 + (7 * i) % 90 for i in range(n)]
                one_completion_s(client, ids, 1)
                best = min(one_completion_s(client, ids, 1) for _ in range(3))
                prefill[str(n)] = 1e3 * best / n
            mine["prefill_ms_per_token"] = prefill
            save()
        marks = [scrape(url)]
        request = RequestSettings()
        shape = Shape(input_tokens=128, output_tokens=512)
        settings = SweepSettings(
            shapes=(shape,), levels=LEVELS, repeats=2, request=request, max_cell_s=200
        )

        def on_cell(cell: CellResult) -> None:
            now = scrape(url)
            before, marks[0] = marks[0], now
            def delta(key: str) -> float:
                return now.get(key, 0.0) - before.get(key, 0.0)

            steps = delta("step_seconds_count:decode")
            secs = delta("step_seconds_sum:decode")
            mine["cells"][str(cell.concurrency)] = {
                "status": cell.status,
                "aggregate_output_tok_s_median": cell.aggregate_output_tok_s_median,
                "tpot_ms_p50_median": cell.tpot_ms_p50_median,
                "ttft_ms_p50_median": cell.ttft_ms_p50_median,
                "server_decode_step_ms_mean": 1e3 * secs / steps if steps else None,
            }
            save()

        async def sweep() -> None:
            async with OpenAIClient(url, settings=request, max_connections=64) as client:
                writer = JobFolder(out / f"{engine}-sweep")
                await run_sweep(client, settings, writer, on_cell=on_cell)

        asyncio.run(sweep())
        log = log_path.read_text(errors="replace")
        compiled = re.search(r"compiled all (\d+) buckets in ([\d.]+)s", log)
        if compiled:
            mine["compiled_buckets"] = int(compiled.group(1))
            mine["compile_s"] = float(compiled.group(2))


def table(result: dict[str, Any]) -> str:
    roof = result.get("roofline", {})
    lines = ["| measure | " + " | ".join(e for e in result["engines"]) + " |"]
    lines.append("|---" * (1 + len(result["engines"])) + "|")

    def row(name: str, get: Any) -> None:
        cells = []
        for e in result["engines"]:
            try:
                value = get(result[e])
                cells.append(f"{value:,.2f}" if isinstance(value, float) else str(value))
            except (KeyError, TypeError):
                cells.append("-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    row("launch to /health (s)", lambda r: r["health_s"])
    row("first completion after health (s)", lambda r: r["first_completion_after_health_s"])
    row("compile (s) / buckets", lambda r: f"{r['compile_s']:.1f} / {r['compiled_buckets']}")
    for n in result["prefill_lens"]:
        row(f"prefill ms/token at {n}", lambda r, n=n: r["prefill_ms_per_token"][str(n)])
    for level in LEVELS:
        key = str(level)
        row(
            f"aggregate tok/s at {level} (128/512)",
            lambda r, k=key: r["cells"][k]["aggregate_output_tok_s_median"],
        )
        row(
            f"server decode step ms at {level}",
            lambda r, k=key: r["cells"][k]["server_decode_step_ms_mean"],
        )
    if roof:
        roof_tok_s = roof["tok_s"]
        row(
            "batch 1 share of roofline",
            lambda r: f"{100 * r['cells']['1']['aggregate_output_tok_s_median'] / roof_tok_s:.1f}%",
        )
        lines.append(
            f"\nroofline: {roof['weight_bytes'] / 1e9:.2f} GB/step over "
            f"{roof['copy_bytes_per_s'] / 1e12:.2f} TB/s = {roof['step_ms']:.3f} ms "
            f"= {roof['tok_s']:.0f} tok/s ({roof['gpu']})"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.jax_vs_pytorch_h200")
    p.add_argument("out", type=Path)
    p.add_argument("--engines", default="jax,pytorch")
    p.add_argument("--jax-flags", default=None, help="the JAX server's flags (default: ours)")
    p.add_argument("--prefill-lens", default=",".join(map(str, PREFILL_LENS)))
    p.add_argument("--no-roofline", action="store_true")
    p.add_argument("--model", default=MODEL, help="random:tiny-gemma4 for a dry run on a CPU")
    args = p.parse_args(argv)
    flags = dict(SERVER_FLAGS)
    if args.jax_flags is not None:
        flags["jax"] = tuple(args.jax_flags.split())
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    engines = [e for e in args.engines.split(",") if e]
    result: dict[str, Any] = {"model": args.model, "engines": engines, "errors": {}}
    result["prefill_lens"] = [int(n) for n in args.prefill_lens.split(",") if n]

    def save() -> None:
        (out / "result.json").write_text(json.dumps(result, indent=2, default=str))

    def engine_section(engine: str) -> Callable[[], None]:
        return lambda: engine_run(engine, out, result, save, flags[engine])

    sections: list[tuple[str, Callable[[], None]]] = []
    if not args.no_roofline:
        sections.append(("roofline", lambda: roofline(result)))
    sections += [(e, engine_section(e)) for e in engines]
    for name, run in sections:
        try:
            run()
        except Exception as e:
            result["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
        save()
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
