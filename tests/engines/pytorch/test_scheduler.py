"""Continuous batching with a stand-in runner (no model): requests join between decode
steps, leave without stalling others, and a failing request fails alone."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from engines.pytorch.sampling import SamplingParams
from engines.pytorch.scheduler import GenerationRequest, Scheduler, StepOutput
from engines.serving.metrics import EngineMetrics
from engines.serving.tokenizer import build_byte_tokenizer

VOCAB = 263
POISON_PROMPT = 99  # a prompt starting with this id fails in prefill
POISON_TOKEN = 150  # a decode row fed this id fails


@dataclass
class _Loaded:
    tokenizer: Any = field(default_factory=build_byte_tokenizer)
    eos_token_ids: list[int] = field(default_factory=lambda: [258])
    max_model_len: int = 256


class _Cache:
    def nbytes(self) -> int:
        return 0


class FakeRunner:
    """Next token = previous token + 1 (mod 200, skipping 0); records decode batch sizes."""

    def __init__(self) -> None:
        self.loaded = _Loaded()
        self.device = torch.device("cpu")
        self.cache = _Cache()
        self.batch_sizes: list[int] = []
        self.cleared: list[int] = []

    def clear_slot(self, slot: int) -> None:
        self.cleared.append(slot)

    @staticmethod
    def _logits(after: int) -> torch.Tensor:
        row = torch.zeros(VOCAB)
        row[after % 200 + 1] = 10.0
        return row

    def prefill(self, slot: int, token_ids: list[int], start: int = 0) -> torch.Tensor:
        if start == 0 and token_ids[0] == POISON_PROMPT:
            raise RuntimeError("poisoned prompt")
        return self._logits(token_ids[-1])

    def decode(self, slots: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        if POISON_TOKEN in tokens:
            raise RuntimeError("poisoned row")
        self.batch_sizes.append(len(slots))
        time.sleep(0.002)  # a step takes time, so later requests arrive mid-run
        return torch.stack([self._logits(t) for t in tokens])


class Collector:
    def __init__(self) -> None:
        self.outputs: dict[str, list[StepOutput]] = {}
        self.lock = threading.Lock()

    def deliver(self, batch: list[tuple[object, StepOutput]]) -> None:
        with self.lock:
            for handle, out in batch:
                self.outputs.setdefault(str(handle), []).append(out)

    def wait(self, ids: list[str], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if all(self.outputs.get(i) and self.outputs[i][-1].finished for i in ids):
                    return
            time.sleep(0.01)
        raise AssertionError(f"not finished in {timeout}s: {ids}")


def _request(rid: str, prompt: list[int], max_tokens: int) -> GenerationRequest:
    return GenerationRequest(
        rid, tuple(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0)
    )


def _scheduler(runner: FakeRunner, collector: Collector, max_running: int = 4) -> Scheduler:
    return Scheduler(
        runner,  # type: ignore[arg-type]
        max_running=max_running,
        metrics=EngineMetrics("fake"),
        deliver=collector.deliver,
        prefill_chunk=4,
        prefill_budget=8,
    )


def test_requests_join_and_leave_between_steps() -> None:
    runner, collector = FakeRunner(), Collector()
    sched = _scheduler(runner, collector, max_running=4)
    sched.start()
    try:
        sched.submit(_request("long", [5, 6, 7], 60), "long")
        time.sleep(0.05)  # "long" is decoding alone by now
        for i in range(5):  # one more than the free slots: the last waits for a slot
            sched.submit(_request(f"short{i}", [10 * (i + 1)] * 9, 5), f"short{i}")
        ids = ["long", *(f"short{i}" for i in range(5))]
        collector.wait(ids)
    finally:
        sched.shutdown()
    long_out = collector.outputs["long"]
    assert [o.completion_tokens for o in long_out] == list(range(1, 61))
    assert [t for o in long_out for t in o.token_ids] == [(7 + k) % 200 + 1 for k in range(60)]
    for i in range(5):
        outs = collector.outputs[f"short{i}"]
        assert len(outs) == 5 and outs[-1].finish_reason == "length"
        assert outs[-1].prompt_tokens == 9  # prefilled in chunks of 4, 4, 1
    assert max(runner.batch_sizes) == 4  # never more rows than slots
    assert runner.batch_sizes[0] == 1 and 1 in runner.batch_sizes[-5:]  # alone, joined, alone again
    assert len(runner.cleared) == 6  # every finished request's slot is cleared for the next


def test_a_failing_request_fails_alone() -> None:
    runner, collector = FakeRunner(), Collector()
    sched = _scheduler(runner, collector)
    sched.start()
    try:
        sched.submit(_request("ok1", [20], 30), "ok1")
        sched.submit(_request("bad-prefill", [POISON_PROMPT, 1], 30), "bad-prefill")
        sched.submit(_request("bad-decode", [POISON_TOKEN - 2], 30), "bad-decode")
        sched.submit(_request("ok2", [40], 30), "ok2")
        collector.wait(["ok1", "bad-prefill", "bad-decode", "ok2"])
        assert sched.alive
    finally:
        sched.shutdown()
    assert collector.outputs["bad-prefill"][-1].finish_reason == "error"
    assert "poisoned prompt" in (collector.outputs["bad-prefill"][-1].error or "")
    bad = collector.outputs["bad-decode"]
    assert bad[-1].finish_reason == "error" and "poisoned row" in (bad[-1].error or "")
    assert len(bad) == 3  # two tokens, then the failing step
    for rid in ("ok1", "ok2"):
        outs = collector.outputs[rid]
        assert outs[-1].finish_reason == "length" and outs[-1].completion_tokens == 30


def test_abort_frees_the_slot_for_the_next_request() -> None:
    runner, collector = FakeRunner(), Collector()
    sched = _scheduler(runner, collector, max_running=1)
    sched.start()
    try:
        sched.submit(_request("forever", [3], 200), "forever")
        sched.submit(_request("next", [4], 3), "next")
        time.sleep(0.05)
        sched.abort("forever")
        collector.wait(["next"])
    finally:
        sched.shutdown()
    assert not collector.outputs["forever"][-1].finished
    assert collector.outputs["next"][-1].completion_tokens == 3


class CompactRunner(FakeRunner):
    """A runner that wants its decode rows in slots 0 ... n - 1 and packs prefill: checks
    every decode step's slots and records swaps and packs."""

    requires_compact_slots = True
    packed_prefill = True

    def __init__(self) -> None:
        super().__init__()
        self.swaps: list[tuple[int, int]] = []
        self.packs: list[int] = []
        self.bad_steps = 0

    def swap_slots(self, a: int, b: int) -> None:
        self.swaps.append((a, b))

    def prefill_many(self, chunks: list[tuple[int, list[int], int]]) -> torch.Tensor:
        self.packs.append(len(chunks))
        return torch.stack([self.prefill(slot, ids, start) for slot, ids, start in chunks])

    def decode(self, slots: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        if sorted(slots) != list(range(len(slots))):
            self.bad_steps += 1
        return super().decode(slots, tokens, positions)


def test_running_sequences_are_compacted_into_the_lowest_slots() -> None:
    runner, collector = CompactRunner(), Collector()
    sched = _scheduler(runner, collector, max_running=6)
    sched.start()
    try:
        # Different lengths, so they finish out of slot order and leave holes.
        lengths = [40, 5, 25, 9, 33, 14]
        for i, n in enumerate(lengths):
            sched.submit(_request(f"r{i}", [10 + i, 11 + i], n), f"r{i}")
        collector.wait([f"r{i}" for i in range(6)])
        time.sleep(0.05)
        sched.submit(_request("late", [7] * 9, 12), "late")  # prefilled in chunks
        collector.wait(["late"])
    finally:
        sched.shutdown()
    assert runner.bad_steps == 0
    assert runner.swaps  # a hole below a running sequence was filled at least once
    assert max(runner.packs) > 1  # several prompts shared a prefill forward
    for i, n in enumerate(lengths):
        outs = collector.outputs[f"r{i}"]
        assert [t for o in outs for t in o.token_ids] == [(11 + i + k) % 200 + 1 for k in range(n)]
    assert collector.outputs["late"][-1].completion_tokens == 12


def test_a_failing_prompt_in_a_pack_fails_alone() -> None:
    runner, collector = CompactRunner(), Collector()
    sched = _scheduler(runner, collector, max_running=4)
    sched.start()
    try:
        sched.submit(_request("ok", [20, 21], 6), "ok")
        sched.submit(_request("bad", [POISON_PROMPT, 1], 6), "bad")
        sched.submit(_request("ok2", [30], 6), "ok2")
        collector.wait(["ok", "bad", "ok2"])
    finally:
        sched.shutdown()
    assert collector.outputs["bad"][-1].finish_reason == "error"
    assert collector.outputs["ok"][-1].completion_tokens == 6
    assert collector.outputs["ok2"][-1].completion_tokens == 6


class _FakeTimingEvent:
    """What the clock uses of `torch.cuda.Event(enable_timing=True)`, on a scripted
    device timeline (CUDA events cannot run here): `record` stamps the current device
    time, `elapsed_time` answers in milliseconds as CUDA does."""

    now_ms = 0.0

    def __init__(self) -> None:
        self.at_ms: float | None = None

    def record(self) -> None:
        self.at_ms = _FakeTimingEvent.now_ms

    def synchronize(self) -> None:
        assert self.at_ms is not None

    def elapsed_time(self, end: _FakeTimingEvent) -> float:
        assert self.at_ms is not None and end.at_ms is not None
        return end.at_ms - self.at_ms


def test_device_clock_times_steps_and_the_idle_gaps_between_decode_steps() -> None:
    from engines.pytorch.device_steps import DeviceClock

    clock = DeviceClock(torch.device("cpu"), make_event=_FakeTimingEvent)
    metrics = EngineMetrics("m")

    def step(start_ms: float, busy_ms: float) -> int | None:
        _FakeTimingEvent.now_ms = start_ms
        turn = clock.start()
        _FakeTimingEvent.now_ms = start_ms + busy_ms
        clock.stop(turn)
        return turn

    # Two steps queued ahead (read one step late, as asynchronous decode reads them),
    # then a prefill, then one more step: its gap holds the prefill, so it is not counted.
    first = step(0.0, 2.0)
    second = step(2.5, 2.0)
    clock.read(first, metrics)
    third = step(5.0, 2.0)
    clock.read(second, metrics)
    clock.read(third, metrics)
    clock.interrupt()
    clock.read(step(20.0, 3.0), metrics)
    assert metrics.device_steps == 4
    assert abs(metrics.device_busy_s - 9e-3) < 1e-12
    assert metrics.device_idle_gaps == 2  # 0.5 ms before the second step and the third
    assert abs(metrics.device_idle_s - 1e-3) < 1e-12
    text = metrics.render()
    assert 'pytorch_engine_decode_device_idle_gaps_total{model_name="m"} 2.0' in text
    assert 'pytorch_engine_decode_device_steps_total{model_name="m"} 4.0' in text


def test_device_clock_is_off_on_cpu() -> None:
    from engines.pytorch.device_steps import DeviceClock

    clock = DeviceClock(torch.device("cpu"))
    metrics = EngineMetrics("m")
    clock.read(clock.start(), metrics)
    assert metrics.device_steps == 0


def _serve_one_profiled(profiler: Any, max_tokens: int) -> list[StepOutput]:
    """One request through a scheduler that profiles its decode steps; its outputs."""
    collector = Collector()
    sched = Scheduler(
        FakeRunner(),  # type: ignore[arg-type]
        max_running=4,
        metrics=EngineMetrics("fake"),
        deliver=collector.deliver,
        profiler=profiler,
    )
    sched.start()
    try:
        sched.submit(_request("a", [5, 6], max_tokens), "a")
        collector.wait(["a"])
    finally:
        sched.shutdown()
    return collector.outputs["a"]


def test_decode_profiler_writes_a_trace_and_table_of_its_window_once(tmp_path: Any) -> None:
    from engines.pytorch.profiling import TABLE_FILE, TRACE_FILE, DecodeProfiler

    profiler = DecodeProfiler(tmp_path / "profile", steps=3, device=torch.device("cpu"), skip=2)
    outputs = _serve_one_profiled(profiler, max_tokens=12)
    assert profiler.done and profiler.seen == 11  # 12 tokens: the first comes from prefill
    table = (tmp_path / "profile" / TABLE_FILE).read_text()
    assert table.startswith("3 decode steps from step 2")
    assert "Self CPU" in table
    trace = (tmp_path / "profile" / TRACE_FILE).read_text()
    assert '"traceEvents"' in trace
    assert "".join(o.text for o in outputs)  # serving went on unchanged


def test_a_failing_device_clock_stops_timing_and_fails_nothing() -> None:
    from engines.pytorch.device_steps import DeviceClock

    class BrokenEvent(_FakeTimingEvent):
        def elapsed_time(self, end: _FakeTimingEvent) -> float:
            raise RuntimeError("CUDA error: the event was not recorded")

    clock = DeviceClock(torch.device("cpu"), make_event=BrokenEvent)
    metrics = EngineMetrics("m")
    turn = clock.start()
    clock.stop(turn)
    clock.read(turn, metrics)
    assert metrics.device_steps == 0 and not clock.pairs
    assert clock.start() is None  # off from now on


def test_a_profile_that_cannot_be_written_fails_no_request(tmp_path: Any) -> None:
    from engines.pytorch.profiling import DecodeProfiler

    blocked = tmp_path / "a-file"
    blocked.write_text("")  # the profile directory cannot be made under a file
    profiler = DecodeProfiler(blocked / "profile", steps=2, device=torch.device("cpu"), skip=1)
    outputs = _serve_one_profiled(profiler, max_tokens=8)
    assert profiler.done
    assert outputs[-1].finish_reason == "length"
