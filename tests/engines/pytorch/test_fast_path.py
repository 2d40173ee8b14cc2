"""The CUDA fast path's scheduling on CPU, end to end with a real model: batched decode
over static pools with slot compaction and packed prefill gives the same greedy text as
the row-by-row path, while requests join and leave at different times."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from engines.pytorch.metrics import EngineMetrics
from engines.pytorch.model import LoadedModel, load_model
from engines.pytorch.runner import ModelRunner
from engines.pytorch.sampling import SamplingParams
from engines.pytorch.scheduler import GenerationRequest, Scheduler, StepOutput


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_model("random:tiny-gemma4", device="cpu", seed=0)


def _serve(runner: ModelRunner, jobs: list[tuple[list[int], int]]) -> list[list[int]]:
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

    sched = Scheduler(
        runner,
        max_running=runner.cache.num_slots,
        metrics=EngineMetrics("test"),
        deliver=deliver,
        prefill_chunk=8,
        prefill_budget=24,
    )
    sched.start()
    try:
        for i, (prompt, n) in enumerate(jobs):
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
            sched.submit(GenerationRequest(f"r{i}", tuple(prompt), params), f"r{i}")
            if i == 3:
                time.sleep(0.2)  # the first ones are decoding by now
        assert done.wait(60), "requests did not finish"
    finally:
        sched.shutdown()
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
