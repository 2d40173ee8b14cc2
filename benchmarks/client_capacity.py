"""Client capacity: does the load generator measure the server, or itself?

Starts the scripted reference server (refserver/) pinned to one
core and each client pinned to the other, and drives it with a closed loop of N streams:
our client (fast transport and httpx transport), AIPerf 0.13 and guidellm 0.8.1. Every
figure is checked against the server's own log of when it received each request and wrote
each chunk (perf_counter_ns; CLOCK_MONOTONIC, shared by both processes):

- in flight: time-weighted requests between receipt and last write, as the SERVER saw them,
  over first receipt .. last receipt (the closed loop's drain is nobody's fault);
- reported vs sent: the client's aggregate output tok/s against tokens the server wrote /
  (last write - first receipt);
- TTFT and ITL error: the client's reported p50/p99 minus the server's true p50/p99 (the
  same method for every client); for ours also paired request by request (x-request-id);
- flat out: the server sends as fast as it can; the client's sustained tok/s;
- client CPU seconds per million tokens (user+sys of the client process tree).

Run: `python -m benchmarks.client_capacity` (about 5 minutes; the third-party tools are
installed on first use into their own venvs, see benchmarks/thirdparty.py). `--only ours`
skips them. Prints a table and writes `benchmarks/results/client_capacity.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from contract import metrics
from contract.results import RequestRecord
from refserver import GroundTruthRequest, reference_server

log = logging.getLogger(__name__)

MS = 1_000_000
SERVER_CPU, CLIENT_CPU = 1, 0
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Scenario:
    name: str
    streams: int
    requests: int
    ttft_ms: float
    itl_ms: float
    input_tokens: int
    output_tokens: int


SCENARIOS = (
    Scenario("L4 pace, 1 stream", 1, 12, 50, 7, 128, 128),
    Scenario("L4 pace, 64 streams", 64, 640, 50, 7, 128, 128),
    Scenario("flat out, 64 streams", 64, 256, 0, 0, 128, 512),
)


@dataclass
class Row:
    scenario: str
    client: str
    ok: int
    failed: int
    in_flight_server: float | None
    reported_tok_s: float | None
    sent_tok_s: float | None
    reported_vs_sent_pct: float | None
    ttft_p50_err_ms: float | None
    ttft_p99_err_ms: float | None
    itl_p50_err_ms: float | None
    itl_p99_err_ms: float | None
    paired_ttft_p99_err_ms: float | None
    paired_itl_p50_err_ms: float | None
    cpu_s_per_mtok: float | None
    note: str = ""
    # The paired TTFT error split in two: request path (server parsed - client sent), which
    # includes the server's own lag in reading, and receive path (client's arrival stamp -
    # server's write of the first token), which is the client's measurement alone.
    send_lag_p99_ms: float | None = None
    receive_lag_p99_ms: float | None = None


# ---------------------------------------------------------------------------------------
# Our client, run as its own pinned process so its CPU is measured like the tools'.
# ---------------------------------------------------------------------------------------


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _our_run(url: str, s: Scenario, transport: str) -> tuple[list[RequestRecord], float]:
    """The closed loop; returns the records and the CPU seconds of the load window alone."""
    from agent.loadgen.client import ChatRequest, OpenAIClient
    from agent.loadgen.prompts import WORDS

    async with OpenAIClient(url, transport=transport, max_connections=s.streams) as client:
        await client.server_info()
        await client.warm(s.streams)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(s.requests):
            queue.put_nowait(i)
        records: list[RequestRecord] = []

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                # Byte-level server: a fixed-width unique head, then filler to the length.
                head = f"{i:08d} "
                filler = " ".join(WORDS)
                prompt = (head + filler * (s.input_tokens // len(filler) + 1))[: s.input_tokens]
                request = ChatRequest(
                    prompt=prompt, max_tokens=s.output_tokens, label="cap", request_id=f"cap-{i}"
                )
                records.append(await client.send(request))

        cpu_start = _cpu_s()
        await asyncio.gather(*(worker() for _ in range(s.streams)))
        return records, _cpu_s() - cpu_start


def _worker_main(args: argparse.Namespace) -> int:
    os.sched_setaffinity(0, {CLIENT_CPU})
    scenario = Scenario(**json.loads(args.scenario))
    records, cpu_s = asyncio.run(_our_run(args.url, scenario, args.transport))
    Path(args.out).write_text(
        json.dumps({"cpu_s": cpu_s, "records": [r.model_dump(mode="json") for r in records]})
    )
    return 0


def _run_ours(
    url: str, s: Scenario, transport: str, work: Path
) -> tuple[list[RequestRecord], float]:
    out = work / f"ours-{transport}.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.client_capacity",
            "--worker",
            "--url",
            url,
            "--transport",
            transport,
            "--scenario",
            json.dumps(asdict(s)),
            "--out",
            str(out),
        ],
        check=True,
        cwd=ROOT,
        timeout=600,
    )
    data = json.loads(out.read_text())
    return [RequestRecord.model_validate(r) for r in data["records"]], float(data["cpu_s"])


# ---------------------------------------------------------------------------------------
# Ground truth
# ---------------------------------------------------------------------------------------


def _truth(log_path: Path) -> list[GroundTruthRequest]:
    rows = [
        GroundTruthRequest.from_json(json.loads(line))
        for line in log_path.read_text().splitlines()
        if line.strip()
    ]
    return [r for r in rows if r.token_chunks]


def _server_in_flight(truth: list[GroundTruthRequest]) -> float | None:
    start = min(t.t_recv_ns for t in truth)
    end = max(t.t_recv_ns for t in truth)
    if end <= start:
        return 1.0 if truth else None
    busy = sum(
        max(0, min(t.token_chunks[-1].t_write_ns, end) - max(t.t_recv_ns, start)) for t in truth
    )
    return busy / (end - start)


def _sent_tok_s(truth: list[GroundTruthRequest]) -> float:
    tokens = sum(c.tokens for t in truth for c in t.token_chunks)
    span = max(t.token_chunks[-1].t_write_ns for t in truth) - min(t.t_recv_ns for t in truth)
    return tokens / (span / 1e9)


def _pct(values: list[float], p: float) -> float | None:
    return metrics.percentile(sorted(values), p) if values else None


def _true_ttfts_ms(truth: list[GroundTruthRequest]) -> list[float]:
    return [t.ttft_ns / MS for t in truth if t.ttft_ns is not None]


def _true_itls_ms(truth: list[GroundTruthRequest]) -> list[float]:
    return [gap / MS for t in truth for gap in t.itl_ns]


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _row_ours(
    s: Scenario,
    client: str,
    records: list[RequestRecord],
    cpu_s: float,
    truth: list[GroundTruthRequest],
) -> Row:
    ok = [r for r in records if r.ok]
    window = metrics.window_stats(records, repeat=0, mode="burst", concurrency=s.streams)
    sent = _sent_tok_s(truth)
    by_id = {t.request_id: t for t in truth}
    paired_ttft, paired_itl, send_lag, receive_lag = [], [], [], []
    for r in ok:
        t = by_id.get(r.request_id)
        if t is None or t.ttft_ns is None:
            continue
        paired_ttft.append(metrics.ttft_ms(r) - t.ttft_ns / MS)
        send_lag.append((t.t_recv_ns - r.send_ns) / MS)
        if r.first_token_ns is not None:
            receive_lag.append((r.first_token_ns - t.token_chunks[0].t_write_ns) / MS)
        paired_itl.extend(
            abs(g - tg / MS) for (g, _), tg in zip(metrics.itl_gaps_ms(r), t.itl_ns, strict=False)
        )
    ttfts = [v for r in ok if (v := metrics.ttft_ms(r)) is not None]
    itls = [g for r in ok for g, _ in metrics.itl_gaps_ms(r)]
    tokens = sum(r.output_tokens for r in ok)
    reported = window.aggregate_output_tok_s
    return Row(
        scenario=s.name,
        client=client,
        ok=len(ok),
        failed=len(records) - len(ok),
        in_flight_server=_server_in_flight(truth),
        reported_tok_s=reported,
        sent_tok_s=sent,
        reported_vs_sent_pct=(reported / sent - 1) * 100 if reported else None,
        ttft_p50_err_ms=_diff(_pct(ttfts, 50), _pct(_true_ttfts_ms(truth), 50)),
        ttft_p99_err_ms=_diff(_pct(ttfts, 99), _pct(_true_ttfts_ms(truth), 99)),
        itl_p50_err_ms=_diff(_pct(itls, 50), _pct(_true_itls_ms(truth), 50)),
        itl_p99_err_ms=_diff(_pct(itls, 99), _pct(_true_itls_ms(truth), 99)),
        paired_ttft_p99_err_ms=_pct(paired_ttft, 99),
        paired_itl_p50_err_ms=_pct(paired_itl, 50),
        send_lag_p99_ms=_pct(send_lag, 99),
        receive_lag_p99_ms=_pct(receive_lag, 99),
        cpu_s_per_mtok=cpu_s / tokens * 1e6 if tokens else None,
    )


def _row_tool(s: Scenario, run, truth: list[GroundTruthRequest]) -> Row:
    sent = _sent_tok_s(truth) if truth else None
    reported = run.output_tok_s
    itls: list[float] = []
    for r in run.ok_records():
        if r.chunk_times_s and len(r.chunk_times_s) > 1:
            itls.extend((b - a) * 1000 for a, b in itertools.pairwise(r.chunk_times_s))
    itl_p50 = _pct(itls, 50) if itls else run.itl_p50_ms
    itl_p99 = _pct(itls, 99) if itls else run.itl_p99_ms
    tokens = sum(r.output_tokens or 0 for r in run.ok_records())
    cpu = run.cpu_window_s if run.cpu_window_s is not None else run.cpu_s
    return Row(
        scenario=s.name,
        client=f"{run.tool} {run.version}",
        ok=run.requests_ok,
        failed=run.requests_failed,
        in_flight_server=_server_in_flight(truth) if truth else None,
        reported_tok_s=reported,
        sent_tok_s=sent,
        reported_vs_sent_pct=(reported / sent - 1) * 100 if reported and sent else None,
        ttft_p50_err_ms=_diff(run.ttft_p50_ms, _pct(_true_ttfts_ms(truth), 50)),
        ttft_p99_err_ms=_diff(run.ttft_p99_ms, _pct(_true_ttfts_ms(truth), 99)),
        itl_p50_err_ms=_diff(itl_p50, _pct(_true_itls_ms(truth), 50)),
        itl_p99_err_ms=_diff(itl_p99, _pct(_true_itls_ms(truth), 99)),
        paired_ttft_p99_err_ms=None,
        paired_itl_p50_err_ms=None,
        cpu_s_per_mtok=cpu / tokens * 1e6 if tokens and cpu else None,
        note=("ITL from chunk times" if itls else f"ITL as reported: {run.itl_definition}")
        + ("; CPU in load window" if run.cpu_window_s is not None else ""),
    )


def _measure(s: Scenario, client: str, work: Path) -> Row:
    log_path = work / f"truth-{client.replace(' ', '_')}-{s.streams}-{s.itl_ms}.jsonl"
    with reference_server(
        ttft_ms=s.ttft_ms, itl_ms=s.itl_ms, cpu=SERVER_CPU, log=log_path, gt_max_chunks=1000
    ) as server:
        if client.startswith("ours"):
            transport = client.split("-", 1)[1]
            records, cpu_s = _run_ours(server.url, s, transport, work)
        else:
            from benchmarks import thirdparty

            runner = thirdparty.run_aiperf if client == "aiperf" else thirdparty.run_guidellm
            run = runner(
                server.url,
                "reference-model",
                concurrency=s.streams,
                input_tokens=s.input_tokens,
                output_tokens=s.output_tokens,
                request_count=s.requests,
                out_dir=work / f"{client}-{s.streams}-{s.itl_ms}",
                cpu=CLIENT_CPU,
            )
    truth = _truth(log_path)
    if client.startswith("ours"):
        return _row_ours(s, client, records, cpu_s, truth)
    return _row_tool(s, run, truth)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _table(rows: list[Row]) -> Table:
    table = Table(
        title="Client capacity against the reference server (server on CPU 1, client on CPU 0)"
    )
    for column in (
        "scenario",
        "client",
        "ok/failed",
        "in flight",
        "reported tok/s",
        "sent tok/s",
        "rep-sent %",
        "TTFT p50 err",
        "TTFT p99 err",
        "ITL p50 err",
        "ITL p99 err",
        "paired TTFT p99",
        "paired ITL p50",
        "CPU s/Mtok",
    ):
        table.add_column(column, justify="left" if column in ("scenario", "client") else "right")
    for r in rows:
        table.add_row(
            r.scenario,
            r.client,
            f"{r.ok}/{r.failed}",
            _fmt(r.in_flight_server, 2),
            _fmt(r.reported_tok_s),
            _fmt(r.sent_tok_s),
            _fmt(r.reported_vs_sent_pct, 2),
            _fmt(r.ttft_p50_err_ms, 2),
            _fmt(r.ttft_p99_err_ms, 2),
            _fmt(r.itl_p50_err_ms, 3),
            _fmt(r.itl_p99_err_ms, 3),
            _fmt(r.paired_ttft_p99_err_ms, 2),
            _fmt(r.paired_itl_p50_err_ms, 4),
            _fmt(r.send_lag_p99_ms, 2),
            _fmt(r.receive_lag_p99_ms, 2),
            _fmt(r.cpu_s_per_mtok, 2),
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", choices=("ours", "all"), default="all", help="ours: skip AIPerf and guidellm"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks/results/client_capacity.json",
        help="where the rows are written as JSON",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--transport", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        args.out = Path(str(args.out))
        return _worker_main(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if len(os.sched_getaffinity(0)) < 2:
        print("needs two CPUs (server and client each pinned to one)", file=sys.stderr)
        return 2
    clients = ["ours-fast", "ours-httpx"] + ([] if args.only == "ours" else ["aiperf", "guidellm"])
    rows: list[Row] = []
    console = Console(width=220)
    with tempfile.TemporaryDirectory(prefix="client-capacity-") as tmp:
        work = Path(tmp)
        for scenario in SCENARIOS:
            for client in clients:
                started = time.monotonic()
                try:
                    rows.append(_measure(scenario, client, work))
                except Exception as exc:
                    log.exception("%s / %s failed", scenario.name, client)
                    rows.append(
                        Row(scenario.name, client, 0, 0, *([None] * 11), note=f"failed: {exc}")
                    )
                log.info("%s / %s: %.1f s", scenario.name, client, time.monotonic() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    console.print(_table(rows))
    for r in rows:
        if r.note:
            console.print(f"{r.scenario} / {r.client}: {r.note}")
    console.print(f"rows written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
