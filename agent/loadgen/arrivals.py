"""Rate mode: open-loop request arrivals at a request rate, and what they did to the server.

Gaps between arrivals are drawn from a gamma distribution of shape `burstiness` and mean
1/rate, from a seeded generator (shape 1 is a Poisson process), as `vllm bench serve
--request-rate R --burstiness K` draws them. Each request is released when it is due, not
when an earlier one finishes; `max_concurrency` optionally caps how many are in flight, the
rest wait in the client (that wait is recorded apart from the scheduler's own lateness).

A window is `steady_warmup_s` of arrivals labelled warm-up, then `steady_window_s` of
measured ones; the window ends when every released request has finished. Over-saturation is
read afterwards from the records: the number of requests due but not finished is followed
through the measured window, and a cell whose backlog keeps growing is flagged with why.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Callable, Sequence

from agent.loadgen.client import ChatRequest, OpenAIClient
from agent.loadgen.prompts import PromptFactory
from contract import metrics
from contract.results import ArrivalStats, RequestRecord
from contract.suite import MAX_CONCURRENCY, Shape, SweepSettings

__all__ = [
    "arrival_offsets_s",
    "arrival_stats",
    "connections_for",
    "run_rate_window",
]

ProgressHook = Callable[[int], None]
# Arrivals are scheduled from a moment a little ahead, so the first is not already late.
_LEAD_NS = 20_000_000
_OUTSTANDING_POINTS = 200
_WARM_MAX = 256
_SPIN_NS = 1_500_000
# A backlog that grew by at least this many requests, and by half of where it started,
# through the window (its fitted trend, not two noisy end points) is over-saturation.
_GROWTH_MIN_REQUESTS = 3.0
_GROWTH_MIN_FRACTION = 0.5


def arrival_offsets_s(
    rate: float, burstiness: float, horizon_s: float, seed: int | str
) -> list[float]:
    """Arrival times in seconds from 0, gaps gamma(shape=burstiness, mean=1/rate), < horizon."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be > 0")
    rng = random.Random(seed)
    scale = 1.0 / (rate * burstiness)
    offsets: list[float] = []
    t = 0.0
    # Bounded: the expected count is rate * horizon; a runaway is impossible but capped.
    limit = int(rate * horizon_s * 4) + 100
    while len(offsets) < limit:
        t += rng.gammavariate(burstiness, scale)
        if t >= horizon_s:
            break
        offsets.append(t)
    return offsets


def connections_for(settings: SweepSettings) -> int:
    """Connections the client may need: the cap in rate mode, else the highest level."""
    if settings.mode == "rate":
        return settings.max_concurrency or MAX_CONCURRENCY
    return max(settings.levels)


async def run_rate_window(
    client: OpenAIClient,
    prompts: PromptFactory,
    settings: SweepSettings,
    shape: Shape,
    rate: float,
    label: str,
    *,
    seed: int | str,
    progress: ProgressHook | None = None,
) -> tuple[list[RequestRecord], tuple[int, int]]:
    """Release one window's arrivals on schedule; returns every record and the measured span."""
    warmup_s = settings.steady_warmup_s if settings.warmup else 0.0
    horizon_s = warmup_s + settings.steady_window_s
    offsets = arrival_offsets_s(rate, settings.burstiness, horizon_s, seed)
    # Prompts are built before the first arrival: tokenize calls would delay the schedule.
    pool = await prompts.build(len(offsets), shape.input_tokens)
    cap = asyncio.Semaphore(settings.max_concurrency) if settings.max_concurrency else None
    # Connections are opened ahead for about a second's arrivals; more open on demand.
    await client.warm(min(settings.max_concurrency or _WARM_MAX, math.ceil(rate) + 2))

    async def one(request: ChatRequest, scheduled_ns: int, released_ns: int) -> RequestRecord:
        if cap is None:
            record = await client.send(request, dispatch_ns=released_ns)
        else:
            async with cap:
                record = await client.send(request)
        if progress:
            progress(1)
        return record.model_copy(update={"scheduled_ns": scheduled_ns, "released_ns": released_ns})

    start_ns = time.perf_counter_ns() + _LEAD_NS
    window = (start_ns + int(warmup_s * 1e9), start_ns + int(horizon_s * 1e9))
    tasks: list[asyncio.Task[RequestRecord]] = []
    for i, (offset, prompt) in enumerate(zip(offsets, pool, strict=True)):
        due_ns = start_ns + int(offset * 1e9)
        delay_ns = due_ns - time.perf_counter_ns()
        if delay_ns > _SPIN_NS:
            await asyncio.sleep((delay_ns - _SPIN_NS) / 1e9)
        # The loop's timers wake up to a millisecond late (epoll's timeout is whole ms), so
        # the last stretch yields to the loop turn by turn, still serving the streams.
        while time.perf_counter_ns() < due_ns:  # noqa: ASYNC110 - a deadline, not an event
            await asyncio.sleep(0)
        released_ns = time.perf_counter_ns()
        request = ChatRequest(
            prompt=prompt.text,
            max_tokens=shape.output_tokens,
            label=label,
            request_id=f"{label}/{i}",
            phase="warmup" if due_ns < window[0] else "measured",
            input_tokens_target=shape.input_tokens,
        )
        tasks.append(asyncio.create_task(one(request, due_ns, released_ns)))
    records = list(await asyncio.gather(*tasks))
    return records, window


def _finish_ns(record: RequestRecord) -> int:
    finish = record.last_token_ns if record.last_token_ns is not None else record.end_ns
    return finish if finish is not None else record.send_ns


def _outstanding(records: Sequence[RequestRecord], points: Sequence[int]) -> list[int]:
    """Requests due but not finished at each point (a sweep over sorted event times)."""
    due = sorted(r.scheduled_ns for r in records if r.scheduled_ns is not None)
    done = sorted(_finish_ns(r) for r in records if r.scheduled_ns is not None)
    counts = []
    i = j = 0
    for t in points:
        while i < len(due) and due[i] <= t:
            i += 1
        while j < len(done) and done[j] <= t:
            j += 1
        counts.append(i - j)
    return counts


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var


def arrival_stats(
    records: Sequence[RequestRecord],
    window_ns: tuple[int, int],
    *,
    rate: float,
    settings: SweepSettings,
) -> ArrivalStats:
    """What one window offered, how late it went out, and whether the backlog kept growing."""
    start_ns, end_ns = window_ns
    window_s = (end_ns - start_ns) / 1e9
    measured = sorted(
        (r for r in records if r.scheduled_ns is not None and start_ns <= r.scheduled_ns < end_ns),
        key=lambda r: r.scheduled_ns or 0,
    )
    due = [r.scheduled_ns for r in measured if r.scheduled_ns is not None]
    gaps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(due)]
    gap_mean = sum(gaps_ms) / len(gaps_ms) if gaps_ms else None
    gap_cv = None
    if gap_mean and len(gaps_ms) > 1:
        var = sum((g - gap_mean) ** 2 for g in gaps_ms) / (len(gaps_ms) - 1)
        gap_cv = math.sqrt(var) / gap_mean
    lag_ms, queue_ms = [], []
    for r in measured:
        if r.scheduled_ns is None or r.released_ns is None:
            continue
        queued = max(0, r.dispatch_ns - r.released_ns)
        lag_ms.append((r.send_ns - r.scheduled_ns - queued) / 1e6)
        queue_ms.append(queued / 1e6)

    step = (end_ns - start_ns) / (_OUTSTANDING_POINTS - 1)
    points = [start_ns + int(k * step) for k in range(_OUTSTANDING_POINTS)]
    backlog = _outstanding(records, points)
    tenth = max(1, _OUTSTANDING_POINTS // 10)
    first = sum(backlog[:tenth]) / tenth
    last = sum(backlog[-tenth:]) / tenth
    xs = [(p - start_ns) / 1e9 for p in points]
    trend_per_s = _slope(xs, [float(b) for b in backlog]) if window_s > 0 else 0.0
    growth = trend_per_s * window_s
    over = growth >= max(_GROWTH_MIN_REQUESTS, _GROWTH_MIN_FRACTION * first)
    reason = None
    if over:
        finished = sum(1 for r in records if start_ns <= _finish_ns(r) < end_ns)
        reason = (
            f"requests due but not finished grew from {first:.1f} to {last:.1f} through the "
            f"{window_s:g} s window ({trend_per_s:+.1f}/s): {len(due) / window_s:.1f} req/s "
            f"offered, {finished / window_s:.1f} req/s finished"
        )
        waited = [q for q in queue_ms if q > 1.0]
        if settings.max_concurrency and waited:
            reason += (
                f"; {len(waited)} waited on max_concurrency {settings.max_concurrency} "
                f"(up to {max(waited) / 1000:.1f} s)"
            )
    return ArrivalStats(
        request_rate=rate,
        burstiness=settings.burstiness,
        max_concurrency=settings.max_concurrency,
        scheduled=len(due),
        offered_rate=len(due) / window_s if window_s > 0 else None,
        gap_ms_mean=gap_mean,
        gap_cv=gap_cv,
        schedule_lag_ms=metrics.distribution(lag_ms),
        client_queue_ms=metrics.distribution(queue_ms),
        outstanding_start=first,
        outstanding_end=last,
        over_saturated=over,
        over_saturation_reason=reason,
    )
