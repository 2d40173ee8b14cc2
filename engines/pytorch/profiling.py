"""A window of the serving loop's decode steps under torch.profiler, once per server run:
host ops of every thread and, on CUDA, kernels and copies, written as a Chrome trace and a
table (`--profile-dir`, `--profile-decode-steps`).

Why: the model step alone and the same step inside the server can differ (measured in
benchmarks/records/2026-11-30-h200-pytorch-async-default.md), and the `/metrics` device
clock says only whether the device or the host set the pace.
A trace of real serving shows which host work or which kernels fill the difference.

The window opens at the `skip`-th decode step (past warm-up and the first requests'
prefill) and closes `steps` steps later; the files are written on the scheduler thread
when it closes, and the loop goes on unprofiled.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

log = logging.getLogger(__name__)

TRACE_FILE = "decode-trace.json"
TABLE_FILE = "decode-profile.txt"


class DecodeProfiler:
    """Profiles decode steps `skip` ... `skip + steps - 1` of the serving loop."""

    def __init__(self, out_dir: Path, steps: int, device: torch.device, skip: int = 64) -> None:
        if steps < 1:
            raise ValueError(f"profile at least one decode step, got {steps}")
        self.out_dir = out_dir
        self.steps = steps
        self.skip = skip
        self.on_cuda = device.type == "cuda"
        self.seen = 0
        self.done = False
        self._profile: profile | None = None

    def before_step(self) -> None:
        if self.done or self.seen != self.skip:
            return
        try:
            self._start()
        except Exception:
            self._give_up("starting")

    def after_step(self) -> None:
        self.seen += 1
        if self._profile is None or self.seen < self.skip + self.steps:
            return
        try:
            self._finish()
        except Exception:
            self._give_up("writing")

    def _give_up(self, doing: str) -> None:
        # A profile must never fail the requests it watches: log, and profile no more.
        log.exception("decode profiler failed %s; serving goes on unprofiled", doing)
        self.done = True
        self._profile = None

    def _start(self) -> None:
        activities = [ProfilerActivity.CPU]
        if self.on_cuda:
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.synchronize()  # the window starts with nothing queued from before
        self._profile = profile(activities=activities, record_shapes=False)
        self._profile.__enter__()
        log.info("profiling decode steps %d to %d", self.skip, self.skip + self.steps - 1)

    def _finish(self) -> None:
        assert self._profile is not None
        if self.on_cuda:
            torch.cuda.synchronize()  # the last step's kernels finish inside the window
        prof, self._profile = self._profile, None
        prof.__exit__(None, None, None)
        self.done = True
        self.out_dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out_dir / TRACE_FILE))
        sort = "self_cuda_time_total" if self.on_cuda else "self_cpu_time_total"
        header = f"{self.steps} decode steps from step {self.skip}\n"
        table = prof.key_averages().table(sort_by=sort, row_limit=40)
        (self.out_dir / TABLE_FILE).write_text(header + table + "\n")
        log.info("decode profile written to %s", self.out_dir)
