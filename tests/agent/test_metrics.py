"""Every metric in contract.metrics, checked on records built from hand-picked nanoseconds."""

from __future__ import annotations

import math

import pytest

from contract import metrics
from contract.results import RequestRecord

MS = 1_000_000


def record(
    *,
    send_ms: float = 0,
    chunks_ms: tuple[float, ...] = (),
    first_chunk_ms: float | None = None,
    completion_tokens: int | None = None,
    chunk_tokens: tuple[int, ...] | None = None,
    error: str | None = None,
    prompt_tokens: int | None = 100,
) -> RequestRecord:
    chunk_ns = [int(t * MS) for t in chunks_ms]
    return RequestRecord(
        request_id="r",
        label="t",
        endpoint="chat",
        dispatch_ns=int(send_ms * MS),
        send_ns=int(send_ms * MS),
        first_chunk_ns=int(first_chunk_ms * MS)
        if first_chunk_ms is not None
        else (chunk_ns[0] if chunk_ns else None),
        first_token_ns=chunk_ns[0] if chunk_ns else None,
        last_token_ns=chunk_ns[-1] if chunk_ns else None,
        end_ns=chunk_ns[-1] if chunk_ns else None,
        chunk_ns=chunk_ns,
        chunk_tokens=list(chunk_tokens) if chunk_tokens else [1] * len(chunk_ns),
        completion_tokens=completion_tokens if completion_tokens is not None else len(chunk_ns),
        prompt_tokens=prompt_tokens,
        error=error,
    )


def test_ttft_is_send_to_first_token_event_and_ttfc_counts_a_role_chunk():
    r = record(send_ms=10, first_chunk_ms=12, chunks_ms=(60, 67, 74))
    assert metrics.ttft_ms(r) == pytest.approx(50)
    assert metrics.ttfc_ms(r) == pytest.approx(2)


def test_latency_ends_at_the_last_token_event():
    r = record(send_ms=0, chunks_ms=(50, 57, 64, 71))
    assert metrics.latency_ms(r) == pytest.approx(71)


def test_tpot_is_vllm_definition_and_decode_is_its_inverse():
    # 4 tokens: (71 - 50) / (4 - 1) = 7 ms
    r = record(chunks_ms=(50, 57, 64, 71))
    assert metrics.tpot_ms(r) == pytest.approx(7)
    assert metrics.decode_tok_s(r) == pytest.approx(1000 / 7)


def test_tpot_uses_usage_tokens_not_events_when_chunks_carry_several():
    # Two events carrying 3 tokens each: (64 - 50) / (6 - 1) ms.
    r = record(chunks_ms=(50, 64), completion_tokens=6, chunk_tokens=(3, 3))
    assert metrics.tpot_ms(r) == pytest.approx(14 / 5)


def test_tpot_of_one_token_reply_is_undefined_not_zero():
    r = record(chunks_ms=(50,))
    assert metrics.tpot_ms(r) is None
    assert metrics.decode_tok_s(r) is None


def test_e2e_tok_s_is_tokens_over_latency():
    r = record(chunks_ms=(50, 57, 64, 71))
    assert metrics.e2e_tok_s(r) == pytest.approx(4 / 0.071)


def test_itl_gaps_carry_tokens_per_chunk():
    r = record(chunks_ms=(50, 57, 65), completion_tokens=5, chunk_tokens=(1, 2, 2))
    assert metrics.itl_gaps_ms(r) == [(pytest.approx(7), 2), (pytest.approx(8), 2)]


def test_percentiles_interpolate_linearly_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert metrics.percentile(values, 50) == 3.0
    assert metrics.percentile(values, 90) == pytest.approx(4 + 0.6 * 6)
    assert metrics.percentile(values, 99) == pytest.approx(4 + 0.96 * 6)
    assert metrics.percentile([5.0], 99) == 5.0


def test_distribution_has_n_mean_min_max_and_ignores_undefined():
    d = metrics.distribution([3.0, None, 1.0, 2.0])
    assert (d.n, d.mean, d.min, d.max, d.p50) == (3, 2.0, 1.0, 3.0, 2.0)
    assert metrics.distribution([None]).n == 0


def test_geometric_mean():
    assert metrics.geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert metrics.geometric_mean([]) is None


def test_burst_window_aggregate_is_tokens_over_first_send_to_last_finish():
    a = record(send_ms=0, chunks_ms=(50, 60, 70, 80))  # 4 tokens, finishes at 80
    b = record(send_ms=5, chunks_ms=(55, 75, 100))  # 3 tokens, finishes at 100
    failed = record(send_ms=1, chunks_ms=(), error="HTTP 500: boom", completion_tokens=0)
    w = metrics.window_stats([a, b, failed], repeat=0, mode="burst", concurrency=3)
    assert w.requests_ok == 2 and w.requests_failed == 1
    assert w.duration_s == pytest.approx(0.100)
    assert w.aggregate_output_tok_s == pytest.approx(7 / 0.100)
    assert w.request_per_s == pytest.approx(20)
    assert w.errors == ["HTTP 500: boom"]
    # in flight: a 80 ms + b 95 ms + the failed one (never finished) to the window end 99 ms
    assert w.in_flight_mean == pytest.approx((80 + 95 + 99) / 100)


def test_steady_window_counts_requests_finishing_inside_it():
    before = record(send_ms=0, chunks_ms=(10, 20))  # finishes before the window
    inside = record(send_ms=15, chunks_ms=(40, 60))  # inside
    after = record(send_ms=90, chunks_ms=(120, 130))  # finishes after
    w = metrics.window_stats(
        [before, inside, after],
        repeat=0,
        mode="steady",
        concurrency=1,
        window_ns=(30 * MS, 100 * MS),
    )
    assert w.requests_ok == 1
    assert w.aggregate_output_tok_s == pytest.approx(2 / 0.070)
    # in flight over [30,100]: inside 30->60 = 30 ms, after 90->100 = 10 ms
    assert w.in_flight_mean == pytest.approx(40 / 70)


def test_goodput_counts_requests_meeting_every_slo():
    fast = record(send_ms=0, chunks_ms=(20, 25, 30))  # TTFT 20, TPOT 5
    slow_ttft = record(send_ms=0, chunks_ms=(80, 85, 90))  # TTFT 80
    slow_tpot = record(send_ms=0, chunks_ms=(20, 40, 60))  # TPOT 20
    w = metrics.window_stats(
        [fast, slow_ttft, slow_tpot],
        repeat=0,
        mode="burst",
        concurrency=3,
        slo_ttft_ms=50,
        slo_tpot_ms=10,
    )
    assert w.goodput_request_per_s == pytest.approx(1 / 0.090)
    no_slo = metrics.window_stats([fast], repeat=0, mode="burst", concurrency=1)
    assert no_slo.goodput_request_per_s is None
    # End-to-end latency alone: fast and slow_tpot end at 30 and 60 ms, slow_ttft at 90.
    e2el = metrics.window_stats(
        [fast, slow_ttft, slow_tpot], repeat=0, mode="burst", concurrency=3, slo_e2el_ms=60
    )
    assert e2el.goodput_request_per_s == pytest.approx(2 / 0.090)


def test_window_with_no_success_has_no_rates():
    failed = record(chunks_ms=(), error="timeout", completion_tokens=0)
    w = metrics.window_stats([failed], repeat=0, mode="burst", concurrency=1)
    assert w.aggregate_output_tok_s is None and w.request_per_s is None
    assert w.requests_failed == 1


def test_every_declared_request_metric_is_callable_on_a_record():
    r = record(chunks_ms=(50, 57, 64))
    for metric, fn in metrics.REQUEST_METRICS:
        value = fn(r)
        assert value is None or math.isfinite(value), metric.name
    names = [m.name for m, _ in metrics.REQUEST_METRICS] + [m.name for m in metrics.WINDOW_METRICS]
    assert len(names) == len(set(names))
