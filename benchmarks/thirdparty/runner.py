"""Running a tool: pinned to one CPU, its process tree's CPU time sampled, bounded in time,
its output logged (`_run_tool`)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks.thirdparty.install import ensure_tokenizer, ensure_tool
from benchmarks.thirdparty.records import _CPU_SAMPLE_S, TOOL_VERSIONS, ToolRun

log = logging.getLogger(__name__)


class _CpuSampler(threading.Thread):
    """Samples user+sys CPU of a process tree so CPU inside the load window can be cut out.

    Per live process, cpu_times() user+system plus children_user+children_system: a child's
    time moves from its own entry to its parent's children_* when it is reaped, so the sum
    stays continuous and nothing is counted twice.
    """

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self._stop_event = threading.Event()

    def _read(self) -> float | None:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        return total

    def run(self) -> None:
        while not self._stop_event.is_set():
            value = self._read()
            if value is not None:
                self.samples.append((time.time(), value))
            self._stop_event.wait(_CPU_SAMPLE_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)

    def cpu_between(self, a: float, b: float) -> float | None:
        """CPU seconds between epoch times a and b, linearly interpolated."""
        if len(self.samples) < 2 or b <= a:
            return None
        return self._at(b) - self._at(a)

    def _at(self, t: float) -> float:
        s = self.samples
        if t <= s[0][0]:
            return s[0][1]
        for (t0, v0), (t1, v1) in itertools.pairwise(s):
            if t0 <= t <= t1:
                return v0 + (v1 - v0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)
        return s[-1][1]


@dataclass
class _Proc:
    returncode: int
    wall_s: float
    cpu_user_s: float
    cpu_sys_s: float
    timed_out: bool
    sampler: _CpuSampler
    epoch_minus_mono_s: float


def _tool_env(changes: dict[str, str | None]) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _run(
    argv: list[str],
    *,
    env_changes: dict[str, str | None],
    cpu: int | None,
    log_path: Path,
    timeout_s: float,
    cwd: Path,
) -> _Proc:
    """Run one tool process to completion, pinned, timed and CPU-accounted.

    CPU: getrusage(RUSAGE_CHILDREN) after minus before = every descendant that was waited
    for (the tools join their worker processes, so the whole tree is in). A child of this
    process that some other thread reaps meanwhile (say a server stopped mid-run) would be
    counted too, so callers start and stop their servers outside the tool run.
    """

    def pin() -> None:  # runs in the child between fork and exec; workers inherit it
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    env = _tool_env(env_changes)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    offset = time.time() - time.perf_counter()
    t0 = time.perf_counter()
    timed_out = False
    with log_path.open("wb") as logf:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            preexec_fn=pin,  # only sched_setaffinity: safe between fork and exec
            start_new_session=True,  # own process group: a timeout kills every worker
        )
        sampler = _CpuSampler(proc.pid)
        sampler.start()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            log.warning("%s exceeded %.0f s; stopping its process group", argv[0], timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        finally:
            sampler.stop()
    wall = time.perf_counter() - t0
    # Worker processes the tool failed to reap would escape RUSAGE_CHILDREN; end them.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return _Proc(
        returncode=proc.returncode,
        wall_s=wall,
        cpu_user_s=after.ru_utime - before.ru_utime,
        cpu_sys_s=after.ru_stime - before.ru_stime,
        timed_out=timed_out,
        sampler=sampler,
        epoch_minus_mono_s=offset,
    )


def _default_timeout(duration_s: float | None, startup_s: float) -> float:
    """A generous overall limit: every run here is bounded in time as well as requests."""
    if duration_s is not None:
        return startup_s + duration_s * 1.5 + 60
    return startup_s + 600


def _resolve_bounds(
    concurrency: int, request_count: int | None, duration_s: float | None
) -> tuple[int | None, float | None]:
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if request_count is None and duration_s is None:
        # Unbounded runs are not allowed here; ten rounds of the loop by default.
        request_count = max(10 * concurrency, 32)
    return request_count, duration_s


def _run_tool(
    tool: str,
    argv_for: Callable[..., list[str]],
    parse: Callable[[ToolRun, Path], None],
    *,
    env_changes: dict[str, str | None],
    startup_s: float,
    itl_definition: str,
    base_url: str,
    model: str,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
    request_count: int | None,
    duration_s: float | None,
    out_dir: Path,
    cpu: int | None,
    timeout_s: float | None,
) -> ToolRun:
    """One bounded run of a third-party client: install it, build its command line with
    `argv_for`, run it pinned to `cpu` with its log in `out_dir`, then `parse` its output
    folder into the `ToolRun`."""
    request_count, duration_s = _resolve_bounds(concurrency, request_count, duration_s)
    exe = ensure_tool(tool)
    tokenizer = ensure_tokenizer()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = argv_for(
        exe, base_url, model,
        concurrency=concurrency, input_tokens=input_tokens, output_tokens=output_tokens,
        request_count=request_count, duration_s=duration_s, out_dir=out_dir,
        tokenizer=tokenizer,
    )  # fmt: skip
    log_path = out_dir / f"{tool}.log"
    log.info("%s: %s", tool, " ".join(argv))
    proc = _run(
        argv,
        env_changes=env_changes,
        cpu=cpu,
        log_path=log_path,
        timeout_s=timeout_s or _default_timeout(duration_s, startup_s=startup_s),
        cwd=out_dir,
    )
    run = ToolRun(
        tool=tool,
        version=TOOL_VERSIONS[tool],
        argv=argv,
        env_changes=env_changes,
        returncode=proc.returncode,
        out_dir=out_dir,
        concurrency=concurrency,
        itl_definition=itl_definition,
    )
    parse(run, out_dir)
    return _finish(run, proc, log_path)


def _finish(run: ToolRun, proc: _Proc, log_path: Path) -> ToolRun:
    run.returncode = proc.returncode
    run.wall_s = proc.wall_s
    run.cpu_user_s = proc.cpu_user_s
    run.cpu_sys_s = proc.cpu_sys_s
    run.cpu_s = proc.cpu_user_s + proc.cpu_sys_s
    run.timed_out = proc.timed_out
    run.epoch_minus_mono_s = proc.epoch_minus_mono_s
    run.log_path = log_path
    if run.records:
        a = min(r.start_s for r in run.records)
        b = max(r.end_s for r in run.records)
        run.cpu_window_s = proc.sampler.cpu_between(a, b)
    if proc.returncode != 0:
        log.warning("%s exited %s; see %s", run.tool, proc.returncode, log_path)
    return run
