"""Every metric the project reports, defined once.

Per-request metrics are pure functions of one `RequestRecord` (raw perf_counter ns times);
window metrics are pure functions of a set of records and the window they were measured in.
`REQUEST_METRICS` and `WINDOW_METRICS` list them with unit and definition; reports take
their names from here. A metric that is undefined for a record (TPOT of a one-token reply,
TTFT of a request that never streamed) is `None`, never 0.

Definitions (docs/DESIGN.md, "Metric definitions"):
- TTFT: send -> first event carrying content or reasoning content; TTFC: send -> first event
  of any kind (a role-only opening chunk counts here, not in TTFT).
- latency: send -> last content/reasoning event (a trailing usage-only chunk or [DONE] does
  not extend it).
- TPOT = (latency - TTFT) / (output_tokens - 1), as `vllm bench serve`; decode tok/s = 1/TPOT.
- ITL: gaps between consecutive content/reasoning events (per chunk, pooled over requests),
  with the tokens each later event carried.
- e2e tok/s = output_tokens / latency.
- burst window: aggregate output tok/s = output tokens of completed requests / (last finish -
  first send). steady window: output tokens of requests finished inside the window / window.
- in flight = time-weighted mean of requests between send and finish over the window.
- goodput = completed requests meeting every given SLO (TTFT, TPOT, end-to-end latency) /
  window duration.
- percentiles: linear interpolation between closest ranks (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from contract.results import Distribution, RequestRecord, WindowStats
from contract.suite import SweepMode

__all__ = [
    "REQUEST_METRICS",
    "WINDOW_METRICS",
    "Metric",
    "decode_tok_s",
    "distribution",
    "e2e_tok_s",
    "geometric_mean",
    "itl_gaps_ms",
    "latency_ms",
    "median",
    "percentile",
    "tpot_ms",
    "ttfc_ms",
    "ttft_ms",
    "window_stats",
]

_NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Metric:
    """A named metric with its unit and definition, for reports and documentation."""

    name: str
    unit: str
    definition: str


def _ms(later_ns: int | None, earlier_ns: int | None) -> float | None:
    if later_ns is None or earlier_ns is None:
        return None
    return (later_ns - earlier_ns) / _NS_PER_MS


def ttft_ms(r: RequestRecord) -> float | None:
    return _ms(r.first_token_ns, r.send_ns)


def ttfc_ms(r: RequestRecord) -> float | None:
    return _ms(r.first_chunk_ns, r.send_ns)


def latency_ms(r: RequestRecord) -> float | None:
    return _ms(r.last_token_ns, r.send_ns)


def client_queue_ms(r: RequestRecord) -> float | None:
    return _ms(r.send_ns, r.dispatch_ns)


def tpot_ms(r: RequestRecord) -> float | None:
    ttft, latency, n = ttft_ms(r), latency_ms(r), r.output_tokens
    if ttft is None or latency is None or n < 2:
        return None
    return (latency - ttft) / (n - 1)


def decode_tok_s(r: RequestRecord) -> float | None:
    tpot = tpot_ms(r)
    return 1000.0 / tpot if tpot else None


def e2e_tok_s(r: RequestRecord) -> float | None:
    latency = latency_ms(r)
    if not latency or not r.output_tokens:
        return None
    return r.output_tokens / (latency / 1000.0)


def itl_gaps_ms(r: RequestRecord) -> list[tuple[float, int]]:
    """(gap before the event in ms, tokens the event carried) for every event after the first."""
    times = r.chunk_ns
    tokens = r.chunk_tokens if len(r.chunk_tokens) == len(times) else [1] * len(times)
    return [((times[i] - times[i - 1]) / _NS_PER_MS, tokens[i]) for i in range(1, len(times))]


REQUEST_METRICS: tuple[tuple[Metric, Callable[[RequestRecord], float | None]], ...] = (
    (Metric("ttft_ms", "ms", "send -> first content or reasoning event"), ttft_ms),
    (Metric("ttfc_ms", "ms", "send -> first event of any kind"), ttfc_ms),
    (Metric("latency_ms", "ms", "send -> last content or reasoning event"), latency_ms),
    (Metric("tpot_ms", "ms", "(latency - TTFT) / (output tokens - 1)"), tpot_ms),
    (Metric("decode_tok_s", "tok/s", "1 / TPOT"), decode_tok_s),
    (Metric("e2e_tok_s", "tok/s", "output tokens / latency"), e2e_tok_s),
    (Metric("client_queue_ms", "ms", "released by the load loop -> sent"), client_queue_ms),
)

WINDOW_METRICS: tuple[Metric, ...] = (
    Metric(
        "aggregate_output_tok_s",
        "tok/s",
        "burst: output tokens of completed requests / (last finish - first send); "
        "steady: output tokens of requests finished in the window / window",
    ),
    Metric("request_per_s", "req/s", "completed requests / window duration"),
    Metric("goodput_request_per_s", "req/s", "completed requests meeting every SLO / duration"),
    Metric("in_flight_mean", "requests", "time-weighted requests between send and finish"),
    Metric("itl_ms", "ms", "gaps between consecutive content/reasoning events, pooled"),
)


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Linear interpolation between closest ranks over already-sorted values."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = (pct / 100.0) * (len(sorted_values) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def median(values: Iterable[float]) -> float | None:
    ordered = sorted(values)
    return percentile(ordered, 50) if ordered else None


def geometric_mean(values: Iterable[float]) -> float | None:
    positive = [v for v in values if v is not None]
    if not positive or any(v <= 0 for v in positive):
        return None
    return math.exp(sum(math.log(v) for v in positive) / len(positive))


def distribution(values: Iterable[float | None]) -> Distribution:
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return Distribution(n=0)
    return Distribution(
        n=len(ordered),
        mean=sum(ordered) / len(ordered),
        min=ordered[0],
        max=ordered[-1],
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p99=percentile(ordered, 99),
    )


def _finish_ns(r: RequestRecord) -> int | None:
    return r.last_token_ns if r.last_token_ns is not None else r.end_ns


def _meets_slos(
    r: RequestRecord,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
    slo_e2el_ms: float | None = None,
) -> bool:
    ttft, tpot, e2el = ttft_ms(r), tpot_ms(r), latency_ms(r)
    if slo_ttft_ms is not None and (ttft is None or ttft > slo_ttft_ms):
        return False
    if slo_e2el_ms is not None and (e2el is None or e2el > slo_e2el_ms):
        return False
    return not (slo_tpot_ms is not None and tpot is not None and tpot > slo_tpot_ms)


def window_stats(
    records: Sequence[RequestRecord],
    *,
    repeat: int,
    mode: SweepMode,
    concurrency: int,
    window_ns: tuple[int, int] | None = None,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    slo_e2el_ms: float | None = None,
    max_errors: int = 5,
) -> WindowStats:
    """Summarise one measured window.

    burst and rate: `window_ns` is ignored; the window runs from the first send to the last
    finish of a completed request (as `vllm bench serve` times its run). steady: `window_ns`
    = (start, end) is required; a request counts if it finished inside it.
    """
    if mode == "steady":
        if window_ns is None:
            raise ValueError("steady windows need window_ns")
        start_ns, end_ns = window_ns
        counted = [
            r for r in records if (f := _finish_ns(r)) is not None and start_ns <= f <= end_ns
        ]
    else:
        counted = list(records)
        finishes = [f for r in counted if r.ok and (f := _finish_ns(r)) is not None]
        start_ns = min((r.send_ns for r in counted), default=0)
        end_ns = max(finishes, default=start_ns)
    ok = [r for r in counted if r.ok]
    failed = [r for r in counted if not r.ok]
    duration_s = (end_ns - start_ns) / _NS_PER_S
    output_tokens = sum(r.output_tokens for r in ok)
    input_tokens = sum(r.prompt_tokens or 0 for r in ok)
    in_flight_ns = 0
    for r in records:
        finish = _finish_ns(r) or r.end_ns or end_ns
        overlap = min(finish, end_ns) - max(r.send_ns, start_ns)
        in_flight_ns += max(0, overlap)
    per_s = (lambda count: count / duration_s) if duration_s > 0 else (lambda count: None)
    slos_given = any(s is not None for s in (slo_ttft_ms, slo_tpot_ms, slo_e2el_ms))
    good = sum(1 for r in ok if _meets_slos(r, slo_ttft_ms, slo_tpot_ms, slo_e2el_ms))
    drafted = [r for r in ok if r.draft_tokens is not None]
    errors: list[str] = []
    for r in failed:
        message = r.error or "no output tokens"
        if message not in errors and len(errors) < max_errors:
            errors.append(message)
    return WindowStats(
        repeat=repeat,
        mode=mode,
        concurrency=concurrency,
        requests_ok=len(ok),
        requests_failed=len(failed),
        duration_s=duration_s,
        output_tokens=output_tokens,
        input_tokens=input_tokens,
        aggregate_output_tok_s=per_s(output_tokens) if ok else None,
        request_per_s=per_s(len(ok)) if ok else None,
        goodput_request_per_s=per_s(good) if slos_given and ok else None,
        in_flight_mean=(in_flight_ns / (end_ns - start_ns)) if end_ns > start_ns else None,
        usage_mismatches=sum(1 for r in ok if r.usage_chunk_mismatch),
        prefix_cache_hit_tokens=sum(r.cached_prompt_tokens or 0 for r in ok),
        draft_tokens=sum(r.draft_tokens or 0 for r in drafted) if drafted else None,
        draft_accepted_tokens=sum(r.draft_accepted_tokens or 0 for r in drafted)
        if drafted
        else None,
        ttft_ms=distribution(ttft_ms(r) for r in ok),
        tpot_ms=distribution(tpot_ms(r) for r in ok),
        itl_ms=distribution(gap for r in ok for gap, _ in itl_gaps_ms(r)),
        latency_ms=distribution(latency_ms(r) for r in ok),
        e2e_tok_s=distribution(e2e_tok_s(r) for r in ok),
        input_tokens_per_request=distribution(r.prompt_tokens for r in ok),
        errors=errors,
    )
