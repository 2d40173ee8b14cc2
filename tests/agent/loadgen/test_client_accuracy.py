"""The client's TTFT, TPOT and ITL against the reference server's own send times.

The server logs, per request, when it finished parsing the request and when it wrote each
chunk (perf_counter_ns, the same CLOCK_MONOTONIC the client stamps with). So per request:
client TTFT - server TTFT = (request transit) + (first chunk transit + client lag) >= 0, and
each client ITL gap minus the server's gap is the change in transit + lag between chunks.

Tolerances (stated; this 2-core machine is shared, so tails are generous and medians
tight): every chunk arrives after the server wrote it (causality); arrival lag (client
stamp - server write) median <= 1 ms; TTFT error median <= 5 ms for one stream, 8 ms for
64 sent at once (it includes the request's transit, queued behind the others' sends and
the server's parsing), max <= 50 ms; TPOT error <= 0.5 ms per request; ITL error median
<= 0.5 ms.
"""

from __future__ import annotations

import statistics

import pytest

from contract import metrics
from refserver import ReferenceServer
from tests.agent.loadgen.conftest import send_many

MS = 1_000_000
OUTPUT_TOKENS = 32


def _errors(server: ReferenceServer, records) -> tuple[list[float], list[float], list[float]]:
    truth = {gt.request_id: gt for gt in server.ground_truth()}
    ttft_err, tpot_err, itl_err, lag = [], [], [], []
    for r in records:
        gt = truth[r.request_id]
        chunks = gt.token_chunks
        assert r.ok, r.error
        assert r.completion_tokens == OUTPUT_TOKENS == len(r.chunk_ns)
        assert r.usage_chunk_mismatch == 0
        for arrived, written in zip(r.chunk_ns, chunks, strict=True):
            assert arrived >= written.t_write_ns, "a chunk cannot arrive before it was written"
            lag.append((arrived - written.t_write_ns) / MS)
        ttft_err.append(metrics.ttft_ms(r) - gt.ttft_ns / MS)
        tpot_err.append(abs(metrics.tpot_ms(r) - gt.tpot_ns / MS))
        for (gap_ms, _), true_gap in zip(metrics.itl_gaps_ms(r), gt.itl_ns, strict=True):
            itl_err.append(abs(gap_ms - true_gap / MS))
    assert statistics.median(lag) <= 1.0
    return ttft_err, tpot_err, itl_err


@pytest.mark.parametrize("transport", ["fast", "httpx"])
def test_one_stream_matches_ground_truth(paced_server: ReferenceServer, transport: str):
    paced_server.reset()
    records = []
    for i in range(5):
        records += send_many(
            paced_server.url,
            [f"one-{transport}-{i} hello"],
            max_tokens=OUTPUT_TOKENS,
            transport=transport,
        )
    ttft_err, tpot_err, itl_err = _errors(paced_server, records)
    assert min(ttft_err) >= 0
    assert statistics.median(ttft_err) <= 5.0
    assert max(ttft_err) <= 50.0
    assert max(tpot_err) <= 0.5
    assert statistics.median(itl_err) <= 0.5


def test_sixty_four_streams_match_ground_truth(paced_server: ReferenceServer):
    paced_server.reset()
    prompts = [f"many-{i} hello" for i in range(64)]
    records = send_many(paced_server.url, prompts, max_tokens=OUTPUT_TOKENS)
    ttft_err, tpot_err, itl_err = _errors(paced_server, records)
    assert min(ttft_err) >= 0
    # The error is the request's transit plus the first token's: 64 requests sent at once
    # queue in the client's sends and the server's parsing on two cores, so the median
    # request's transit is a few ms (5.1-5.2 ms of error seen on a slower 2-core host).
    # The client's own part, the first token's arrival after its write, stays tight.
    truth = {gt.request_id: gt for gt in paced_server.ground_truth()}
    first_lag = [
        (r.chunk_ns[0] - truth[r.request_id].token_chunks[0].t_write_ns) / MS for r in records
    ]
    assert statistics.median(first_lag) <= 1.0
    assert statistics.median(ttft_err) <= 8.0
    assert max(ttft_err) <= 50.0
    assert max(tpot_err) <= 0.5
    assert statistics.median(itl_err) <= 0.5
    stats = metrics.window_stats(records, repeat=0, mode="burst", concurrency=64)
    assert stats.requests_ok == 64
    # All 64 released at once and paced identically: nearly all of the window has 64 in flight.
    assert stats.in_flight_mean > 60
