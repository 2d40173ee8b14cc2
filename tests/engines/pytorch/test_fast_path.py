"""The CUDA fast path's scheduling on CPU, end to end with a real model: batched decode
over static pools with slot compaction and packed prefill gives the same greedy text as
the row-by-row path, while requests join and leave at different times."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from engines.pytorch.model import LoadedModel, load_model
from engines.pytorch.runner import ModelRunner
from engines.pytorch.sampling import SamplingParams
from engines.pytorch.scheduler import GenerationRequest, Scheduler, StepOutput
from engines.serving.metrics import EngineMetrics


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_model("random:tiny-gemma4", device="cpu", seed=0)


def _serve(
    runner: ModelRunner,
    jobs: list[tuple[list[int], int]],
    *,
    async_decode: bool = False,
    ignore_eos: bool = True,
    stats: dict[str, Any] | None = None,
) -> list[list[int]]:
    """Run greedy requests through a scheduler; the later ones arrive while others run."""
    done = threading.Event()
    outputs: dict[str, list[int]] = {}
    finished: set[str] = set()
    lock = threading.Lock()

    def deliver(batch: list[tuple[object, StepOutput]]) -> None:
        with lock:
            for handle, out in batch:
                outputs.setdefault(str(handle), []).extend(out.token_ids)
                if out.finished:
                    finished.add(str(handle))
            if len(finished) == len(jobs):
                done.set()

    metrics = EngineMetrics("test")
    sched = Scheduler(
        runner,
        max_running=runner.cache.num_slots,
        metrics=metrics,
        deliver=deliver,
        prefill_chunk=8,
        prefill_budget=24,
        async_decode=async_decode,
    )
    sched.start()
    try:
        for i, (prompt, n) in enumerate(jobs):
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=ignore_eos)
            sched.submit(GenerationRequest(f"r{i}", tuple(prompt), params), f"r{i}")
            if i == 3:
                time.sleep(0.2)  # the first ones are decoding by now
        assert done.wait(60), "requests did not finish"
    finally:
        sched.shutdown()
    if stats is not None:
        stats["steps_run_ahead"] = metrics.decode_steps_queued_ahead
        stats["rendered"] = metrics.render()
    return [outputs[f"r{i}"] for i in range(len(jobs))]


@pytest.mark.parametrize("decode_program", [False, True], ids=["modules", "program"])
def test_fast_path_scheduling_keeps_greedy_text(loaded: LoadedModel, decode_program: bool) -> None:
    jobs = [
        ([257, *[(13 * i + 5 * j) % 90 + 33 for j in range(4 + 7 * i)]], n)
        for i, n in enumerate([30, 6, 22, 11, 18, 9, 26])
    ]
    reference = _serve(ModelRunner(loaded, num_slots=4, batch_invariant=True), jobs)
    fast_runner = ModelRunner(
        loaded,
        num_slots=4,
        batch_invariant=False,
        batched_decode=True,
        packed_prefill=True,
        decode_program=decode_program,
    )
    assert (fast_runner.program is not None) == decode_program
    fast = _serve(fast_runner, jobs)
    assert [len(o) for o in reference] == [n for _p, n in jobs]
    assert fast == reference


def _program_runner(loaded: LoadedModel) -> ModelRunner:
    return ModelRunner(
        loaded,
        num_slots=4,
        batch_invariant=False,
        batched_decode=True,
        packed_prefill=True,
        decode_program=True,
    )


@pytest.mark.parametrize("ignore_eos", [True, False], ids=["by-length", "eos-too"])
def test_async_decode_keeps_greedy_text(loaded: LoadedModel, ignore_eos: bool) -> None:
    """Queuing step n + 1 from step n's device tokens, before reading them, changes no
    token: rows that finish (by length or, unforeseen, by EOS) drop their extra token,
    and requests join and leave in between."""
    jobs = [
        ([257, *[(11 * i + 3 * j) % 90 + 33 for j in range(5 + 6 * i)]], n)
        for i, n in enumerate([40, 7, 25, 12, 33, 3, 28, 16])
    ]

    sync = _serve(_program_runner(loaded), jobs, ignore_eos=ignore_eos)
    stats: dict[str, Any] = {}
    ahead = _serve(
        _program_runner(loaded), jobs, async_decode=True, ignore_eos=ignore_eos, stats=stats
    )
    assert ahead == sync
    assert stats["steps_run_ahead"] > 20
    rendered = f'decode_steps_queued_ahead_total{{model_name="test"}} {stats["steps_run_ahead"]}'
    assert rendered in stats["rendered"]  # what /metrics reports
    lengths = [len(o) for o in ahead]
    if ignore_eos:
        assert lengths == [n for _p, n in jobs]
    else:
        assert lengths != [n for _p, n in jobs], lengths  # some stopped early, at EOS


def test_async_decode_steps_sampled_rows_synchronously(loaded: LoadedModel) -> None:
    runner = _program_runner(loaded)
    done = threading.Event()
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def deliver(batch: list[tuple[object, StepOutput]]) -> None:
        with lock:
            for handle, out in batch:
                counts[str(handle)] = counts.get(str(handle), 0) + len(out.token_ids)
                if out.finished:
                    counts[f"{handle}:done"] = 1
            if sum(k.endswith(":done") for k in counts) == 3:
                done.set()

    sched = Scheduler(
        runner,
        max_running=4,
        metrics=EngineMetrics("test"),
        deliver=deliver,
        async_decode=True,
    )
    sched.start()
    try:
        for i, temperature in enumerate([0.0, 1.0, 0.0]):
            params = SamplingParams(max_tokens=20, temperature=temperature, seed=7, ignore_eos=True)
            sched.submit(GenerationRequest(f"r{i}", (257, 40 + i, 41, 42), params), f"r{i}")
        assert done.wait(60)
    finally:
        sched.shutdown()
    assert [counts[f"r{i}"] for i in range(3)] == [20, 20, 20]


def test_async_decode_stops_at_the_models_length() -> None:
    short = load_model("random:tiny-gemma4", device="cpu", seed=0, max_model_len=48)
    jobs = [([257, *range(40, 40 + n)], 100) for n in (10, 30, 45)]  # end by model length
    sync = _serve(_program_runner(short), jobs)
    ahead = _serve(_program_runner(short), jobs, async_decode=True)
    assert ahead == sync
    assert [len(p) + len(o) for (p, _n), o in zip(jobs, ahead, strict=True)] == [48] * 3
