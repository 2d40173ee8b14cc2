"""Export of one measured window in `vllm bench serve`'s result JSON format.

Field names and units follow vLLM's `--save-result` output (vllm/benchmarks/serve.py):
per-request arrays in seconds (`ttfts`, `itls`, `latencies`), summaries in milliseconds
(`mean_ttft_ms`, `p99_itl_ms`, ...). One JSON object per line is what `--append-result`
writes, so tools that read vLLM's results read ours.

Speculative decoding: the `spec_decode_*` keys vLLM writes from its /metrics counters over
the run (acceptance rate in percent, acceptance length = 1 + accepted / drafts, per-position
rates as fractions), from the server's counters over the window where it published them, else
from the responses' own draft counts (llama.cpp); keys the server exposed nothing for are
omitted, as vLLM omits them.
"""

from __future__ import annotations

import statistics
from datetime import datetime

from contract import metrics
from contract.results import RequestRecord, ServerCounters, WindowStats

__all__ = ["vllm_bench_serve_run"]

_PERCENTILES = (50, 90, 99)


def _summary(name: str, values_s: list[float]) -> dict[str, float]:
    values_ms = sorted(v * 1000 for v in values_s)
    if not values_ms:
        return {}
    out = {
        f"mean_{name}_ms": statistics.fmean(values_ms),
        f"median_{name}_ms": metrics.percentile(values_ms, 50),
        f"std_{name}_ms": statistics.pstdev(values_ms),
    }
    for p in _PERCENTILES:
        out[f"p{p}_{name}_ms"] = metrics.percentile(values_ms, p)
    return out


def _peak_in_flight(records: list[RequestRecord]) -> int:
    """Most requests between send and end at once, by a sweep line (as vLLM counts it)."""
    events = sorted(
        [(r.send_ns, 1) for r in records] + [(r.end_ns or r.send_ns, -1) for r in records],
        key=lambda e: (e[0], e[1]),
    )
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def _spec_decode(counters: ServerCounters | None, stats: WindowStats) -> dict[str, object]:
    drafts = counters.spec_drafts if counters else None
    drafted = counters.spec_draft_tokens if counters else None
    accepted = counters.spec_accepted_tokens if counters else None
    if drafted is None and stats.draft_tokens is not None:
        drafted, accepted = float(stats.draft_tokens), float(stats.draft_accepted_tokens or 0)
    out: dict[str, object] = {}
    if drafted and accepted is not None:
        out["spec_decode_acceptance_rate"] = accepted / drafted * 100
    if drafts and accepted is not None:
        out["spec_decode_acceptance_length"] = 1 + accepted / drafts
    elif counters and counters.spec_accept_length is not None:
        out["spec_decode_acceptance_length"] = counters.spec_accept_length
    if drafts is not None:
        out["spec_decode_num_drafts"] = int(drafts)
    if drafted is not None:
        out["spec_decode_draft_tokens"] = int(drafted)
    if accepted is not None and drafted is not None:
        out["spec_decode_accepted_tokens"] = int(accepted)
    if counters and counters.spec_acceptance_rate_per_position:
        out["spec_decode_per_position_acceptance_rates"] = list(
            counters.spec_acceptance_rate_per_position
        )
    return out


def vllm_bench_serve_run(
    records: list[RequestRecord],
    stats: WindowStats,
    *,
    model: str,
    endpoint: str,
    label: str,
    date: datetime,
    server: ServerCounters | None = None,
) -> dict[str, object]:
    """One run's JSON; `server` is what the server's /metrics counted over the window."""
    ok = [r for r in records if r.ok]
    ttfts = [(v or 0.0) / 1000 for v in (metrics.ttft_ms(r) for r in ok)]
    latencies = [(v or 0.0) / 1000 for v in (metrics.latency_ms(r) for r in ok)]
    tpots = [v / 1000 for r in ok if (v := metrics.tpot_ms(r)) is not None]
    itls = [[gap / 1000 for gap, _ in metrics.itl_gaps_ms(r)] for r in ok]
    first_send = min((r.send_ns for r in records), default=0)
    backend = "openai-chat" if endpoint == "chat" else "openai"
    run: dict[str, object] = {
        "date": date.strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend,
        "backend": backend,
        "label": label,
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": len(records),
        "request_rate": stats.arrivals.request_rate if stats.arrivals else "inf",
        "burstiness": stats.arrivals.burstiness if stats.arrivals else 1.0,
        "max_concurrency": stats.arrivals.max_concurrency if stats.arrivals else stats.concurrency,
        "duration": stats.duration_s,
        "completed": stats.requests_ok,
        "failed": stats.requests_failed,
        "total_input_tokens": stats.input_tokens,
        "total_output_tokens": stats.output_tokens,
        "request_throughput": stats.request_per_s,
        "request_goodput": stats.goodput_request_per_s,
        "output_throughput": stats.aggregate_output_tok_s,
        "total_token_throughput": (stats.input_tokens + stats.output_tokens) / stats.duration_s
        if stats.duration_s > 0
        else None,
        "input_lens": [r.prompt_tokens or 0 for r in ok],
        "output_lens": [r.output_tokens for r in ok],
        "ttfts": ttfts,
        "itls": itls,
        "latencies": latencies,
        "start_times": [(r.send_ns - first_send) / 1e9 for r in ok],
        "queue_times": [(r.send_ns - r.dispatch_ns) / 1e9 for r in ok],
        "generated_texts": ["" for _ in ok],
        "errors": [r.error or "" for r in records if not r.ok],
        "max_concurrent_requests": _peak_in_flight(records),
    }
    run |= _summary("ttft", ttfts)
    run |= _summary("tpot", tpots)
    run |= _summary("itl", [gap for gaps in itls for gap in gaps])
    run |= _summary("e2el", latencies)
    run |= _spec_decode(server, stats)
    return run
