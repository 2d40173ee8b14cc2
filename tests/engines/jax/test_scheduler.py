"""The JAX scheduler's run-ahead: while nothing waits to join, it queues the next call of
greedy steps before reading the one in flight, and the text is what one call at a time
gives; a waiting request, a finished row or too few tokens left stop it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import jax
import pytest

from engines.jax import runner as runner_module
from engines.jax.runner import JaxRunner, load
from engines.jax.scheduler import JaxScheduler
from engines.serving.metrics import EngineMetrics
from engines.serving.requests import GenerationRequest, SamplingParams, StepOutput

STEPS = 4
WAIT_S = 120.0


@pytest.fixture(scope="module")
def runner() -> Iterator[JaxRunner]:
    loaded = load(
        "random:tiny-gemma4", dtype="float32", device="cpu", seed=0, max_model_len=128,
        served_name=None,
    )  # fmt: skip
    built = JaxRunner(
        loaded, num_slots=4, prefill_buckets=[32], kv_buckets=[128], batch_buckets=[1],
        decode_steps=STEPS,
    )  # fmt: skip
    with jax.default_device(loaded.device):
        built.compile_all(threads=2)
    yield built


def _generate(runner: JaxRunner, run_ahead: bool) -> list[int]:
    """One greedy request of 5 calls' worth of tokens through a scheduler thread."""
    done = threading.Event()
    tokens: list[int] = []

    def deliver(batch: list[tuple[object, StepOutput]]) -> None:
        for _, out in batch:
            tokens.extend(out.token_ids)
            if out.finished:
                done.set()

    scheduler = JaxScheduler(
        runner, metrics=EngineMetrics("random:tiny-gemma4", prefix="jax_engine"),
        deliver=deliver,
    )  # fmt: skip
    if not run_ahead:
        scheduler._may_run_ahead = lambda rows: False  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=5 * STEPS + 1, temperature=0.0, ignore_eos=True)
    scheduler.start()
    try:
        scheduler.submit(GenerationRequest("r", tuple(range(30, 50)), params), object())
        assert done.wait(WAIT_S)
    finally:
        scheduler.shutdown()
    return tokens


def test_running_ahead_queues_the_next_call_and_keeps_the_text(
    runner: JaxRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    start, read = JaxRunner.start_greedy, runner_module.PendingSteps.tokens

    def spy_start(self: JaxRunner, *args: Any) -> Any:
        events.append("start")
        return start(self, *args)

    def spy_read(self: Any) -> Any:
        events.append("read")
        return read(self)

    monkeypatch.setattr(JaxRunner, "start_greedy", spy_start)
    monkeypatch.setattr(runner_module.PendingSteps, "tokens", spy_read)
    ahead = _generate(runner, run_ahead=True)
    ahead_events, events[:] = list(events), []
    one_at_a_time = _generate(runner, run_ahead=False)
    assert ahead == one_at_a_time and len(ahead) == 5 * STEPS + 1
    # the first token comes from the prefill; then 5 calls, each but the first queued
    # before the one in flight is read (after the fifth, nothing would be left)
    assert ahead_events == ["start", *["start", "read"] * 4, "read"]
    assert events == ["start", "read"] * 5


def test_what_stops_running_ahead(runner: JaxRunner) -> None:
    scheduler = JaxScheduler(
        runner, metrics=EngineMetrics("random:tiny-gemma4", prefix="jax_engine"),
        deliver=lambda batch: None,
    )  # fmt: skip
    params = SamplingParams(max_tokens=100, temperature=0.0)
    scheduler.submit(GenerationRequest("a", (1, 2, 3), params), object())
    scheduler._take_inbox(block=False)
    seq = scheduler._waiting.popleft()
    seq.output_ids = [5]
    rows = [seq]
    assert scheduler._may_run_ahead(rows)
    scheduler.submit(GenerationRequest("b", (1, 2, 3), params), object())
    scheduler._between_calls()
    assert not scheduler._may_run_ahead(rows)  # a request waits to join
    scheduler._waiting.clear()
    seq.output_ids = [5] * (100 - 2 * STEPS + 1)  # one call in flight would leave < a call
    assert not scheduler._may_run_ahead(rows)
    seq.output_ids = [5]
    seq.done = True  # a row finished (or was aborted)
    assert not scheduler._may_run_ahead(rows)

