"""Rate scheduler limit: the highest request rate our rate mode keeps on schedule.

Starts the scripted reference server pinned to one core (short replies, no pacing, so the
server is never what is late), pins this process to the other, and runs one rate-mode
window per rate from a ladder (agent/loadgen/arrivals.py, the same code `bench sweep --mode
rate` runs). Per rate: arrivals offered, schedule lag (actual send - due) p50/p99/max, the
share of requests that completed, and whether the backlog grew (over-saturation). The limit
is the highest rate whose lag p99 is at most 2 ms with every request completed.

Run: `python -m benchmarks.rate_scheduler [--rates 100,200,500,1000] [--window-s 5]`; prints a
table and writes `benchmarks/results/rate_scheduler.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agent.loadgen.arrivals import arrival_stats, run_rate_window
from agent.loadgen.client import OpenAIClient
from agent.loadgen.prompts import PromptFactory, calibrate
from contract import metrics
from contract.suite import Shape, SweepSettings
from refserver.harness import reference_server

SERVER_CPU, CLIENT_CPU = 1, 0
LAG_P99_TARGET_MS = 2.0
ROOT = Path(__file__).resolve().parent.parent
SHAPE = Shape(input_tokens=64, output_tokens=4)


async def _one_rate(url: str, rate: float, window_s: float) -> dict[str, object]:
    settings = SweepSettings(
        shapes=(SHAPE,),
        mode="rate",
        rates=(rate,),
        steady_window_s=window_s,
        steady_warmup_s=1.0,
        repeats=1,
    )
    async with OpenAIClient(url, settings=settings.request, max_connections=1024) as client:
        await client.server_info()
        # Lengths from the calibration alone: thousands of tokenize calls before each window
        # would only slow the benchmark down, not change what is scheduled.
        calibration = (await calibrate(client)).model_copy(update={"tokenize_endpoint": None})
        factory = PromptFactory(calibration, None)
        cpu0 = time.process_time()
        records, window = await run_rate_window(
            client, factory, settings, SHAPE, rate, f"rate{rate:g}", seed=f"bench/{rate}"
        )
        cpu_s = time.process_time() - cpu0
    offered = arrival_stats(records, window, rate=rate, settings=settings)
    measured = [r for r in records if r.phase == "measured"]
    ok = sum(1 for r in measured if r.ok)
    lag = offered.schedule_lag_ms
    # Where the lag goes: the loop waking late for the due time (release), or the work
    # between release and the request's first byte on the socket (send).
    release = metrics.distribution(
        [(r.released_ns - r.scheduled_ns) / 1e6 for r in measured
         if r.released_ns is not None and r.scheduled_ns is not None]
    )  # fmt: skip
    send = metrics.distribution(
        [(r.send_ns - r.released_ns) / 1e6 for r in measured if r.released_ns is not None]
    )
    return {
        "rate": rate,
        "arrivals": offered.scheduled,
        "offered_rate": offered.offered_rate,
        "completed": ok,
        "lag_p50_ms": lag.p50,
        "lag_p99_ms": lag.p99,
        "lag_max_ms": lag.max,
        "release_p99_ms": release.p99,
        "send_p99_ms": send.p99,
        "over_saturated": offered.over_saturated,
        "client_cpu_s": cpu_s,
        "kept": bool(lag.p99 is not None and lag.p99 <= LAG_P99_TARGET_MS and ok == len(measured)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="50,100,200,500,1000,2000")
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/rate_scheduler.json")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    os.sched_setaffinity(0, {CLIENT_CPU})
    rows = []
    print(f"client on CPU {CLIENT_CPU}, server on CPU {SERVER_CPU}", flush=True)
    with reference_server(ttft_ms=0, itl_ms=0, cpu=SERVER_CPU) as server:
        for rate in rates:
            server.reset()
            rows.append(asyncio.run(_one_rate(server.url, rate, args.window_s)))
            print(json.dumps(rows[-1]), flush=True)
    table = Table(title=f"Rate scheduler, lag p99 target {LAG_P99_TARGET_MS} ms")
    for column in ("rate/s", "arrivals", "offered/s", "completed", "lag p50 ms", "lag p99 ms",
                   "lag max ms", "release p99 ms", "send p99 ms", "over-sat.", "client CPU s",
                   "kept"):  # fmt: skip
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            f"{row['rate']:g}", str(row["arrivals"]), f"{row['offered_rate']:.1f}",
            str(row["completed"]), f"{row['lag_p50_ms']:.3f}", f"{row['lag_p99_ms']:.3f}",
            f"{row['lag_max_ms']:.3f}", f"{row['release_p99_ms']:.3f}",
            f"{row['send_p99_ms']:.3f}", str(row["over_saturated"]), f"{row['client_cpu_s']:.2f}",
            "yes" if row["kept"] else "no",
        )  # fmt: skip
    console = Console(width=160)
    console.print(table)
    kept = [row["rate"] for row in rows if row["kept"]]
    console.print(f"highest rate kept: {max(kept) if kept else 'none'} req/s")  # type: ignore[type-var]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"window_s": args.window_s, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
