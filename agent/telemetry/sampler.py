"""The telemetry sampler: one thread for the whole run, writing `telemetry.csv` as it goes.

Every `gpu_interval_s` (100 ms) it reads each GPU through NVML (the costly energy counter
once a second and at every job boundary only), every `host_interval_s`
(1 s) the host and the engine's process tree through psutil, and writes one row per read,
tagged with the job running. The CSV is flushed every `flush_interval_s`; nothing is kept
in memory but one small running summary per job (contract.telemetry_summary), so memory does
not grow with the run.

Job boundaries are sampled, not guessed: `set_job` hands the switch to the thread, which
takes a closing read tagged with the old job and an opening read tagged with the new one
(GPU and host), then confirms. A job's energy (counter delta) therefore runs from its first
to its last read, a few milliseconds short of the switch calls, instead of up to a whole
interval short.

Failures never end the run: no NVML or no GPU means host rows only (said once, at INFO);
NVML read errors leave cells empty (agent.telemetry.gpu); a failing CSV write stops the
rows, not the summaries. The sampler measures its own cost: the CPU time of its thread
(`time.thread_time`) over its wall time, in `stats()`.
"""

from __future__ import annotations

import csv
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TextIO

from agent.telemetry.gpu import GpuDevice, init_nvml, load_nvml, open_gpus
from agent.telemetry.host import HostProbe, load_psutil
from contract.telemetry import TELEMETRY_COLUMNS, GpuDeviceInfo, SamplerStats, TelemetrySummary
from contract.telemetry_samples import Sample
from contract.telemetry_summary import JobAccumulator

__all__ = ["AUTO", "TelemetrySampler"]

log = logging.getLogger(__name__)

# Sentinel: "find the module yourself" (pynvml / psutil); None means "do without".
AUTO: Any = object()

GPU_INTERVAL_S = 0.1
HOST_INTERVAL_S = 1.0
# PCIe throughput blocks ~20 ms per counter inside NVML (see agent.telemetry.gpu), so each
# GPU's PCIe is read at this slower cadence, and one GPU per pass in turn, so no pass blocks
# for more than one GPU's ~40 ms however many GPUs there are.
PCIE_INTERVAL_S = 1.0
ENERGY_INTERVAL_S = 1.0
FLUSH_INTERVAL_S = 1.0
SWITCH_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class _Request:
    kind: Literal["job", "pid", "stop"]
    value: Any
    done: threading.Event | None


class TelemetrySampler:
    """Samples NVML and psutil on its own thread for the whole run.

    Usage:
        with TelemetrySampler(results / TELEMETRY_FILE) as sampler:
            sampler.track_process(server.pid)
            sampler.set_job("vllm-d4/probe")
            ...
            sampler.set_job(None)
            summary = sampler.summary("vllm-d4/probe", output_tokens=n)
        stats = sampler.stats()

    Args:
        csv_path: where rows go; an existing file with the same header is appended to (a
            resumed campaign keeps its earlier rows), one with another header is moved aside.
        nvml: the NVML module (default: pynvml if installed); None samples no GPU. Tests
            pass a stand-in with pynvml's functions, constants and errors.
        psutil_module: psutil (default) or None for no host rows.
    """

    def __init__(
        self,
        csv_path: Path,
        *,
        nvml: Any = AUTO,
        psutil_module: Any = AUTO,
        gpu_interval_s: float = GPU_INTERVAL_S,
        host_interval_s: float = HOST_INTERVAL_S,
        pcie_interval_s: float = PCIE_INTERVAL_S,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        energy_interval_s: float = ENERGY_INTERVAL_S,
    ) -> None:
        for name, value in (
            ("gpu_interval_s", gpu_interval_s),
            ("host_interval_s", host_interval_s),
            ("pcie_interval_s", pcie_interval_s),
            ("energy_interval_s", energy_interval_s),
            ("flush_interval_s", flush_interval_s),
        ):
            if not 0.01 <= value <= 3600:
                raise ValueError(f"{name} must be between 0.01 and 3600 s, got {value}")
        self.csv_path = Path(csv_path)
        self._nvml = load_nvml() if nvml is AUTO else nvml
        self._psutil = load_psutil() if psutil_module is AUTO else psutil_module
        self._gpu_iv = gpu_interval_s
        self._host_iv = host_interval_s
        self._pcie_iv = max(pcie_interval_s, gpu_interval_s)
        self._energy_iv = max(energy_interval_s, gpu_interval_s)
        self._flush_iv = flush_interval_s

        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml_ok = False
        self._gpus: list[GpuDevice] = []
        self._host: HostProbe | None = None
        self._fh: TextIO | None = None
        self._writer: csv.DictWriter[str] | None = None
        self._job: str | None = None
        self._pending_pid: int | None = None
        self._jobs: dict[str, JobAccumulator] = {}
        # Counters (written by the sampler thread, read by stats()).
        self._started_perf: float | None = None
        self._stopped_perf: float | None = None
        self._cpu_s = 0.0
        self._gpu_passes = 0
        self._host_passes = 0
        self._rows = 0
        self._overruns = 0
        self._pcie_turn = 0
        self._internal_errors = 0
        self._csv_errors = 0
        self._warned: set[str] = set()

    # -- life cycle ----------------------------------------------------------------------

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Open the CSV, find the GPUs, start the thread.

        Raises:
            RuntimeError: already started.
            OSError: the CSV cannot be created (the results folder is the caller's problem;
                NVML problems never raise).
        """
        if self._thread is not None:
            raise RuntimeError("telemetry sampler already started")
        self._open_csv()
        self._open_nvml()
        if self._psutil is None:
            log.info("telemetry: psutil not installed; no host rows")
        else:
            self._host = HostProbe(self._psutil)
            self._host.follow(self._pending_pid)
        self._started_perf = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="telemetry-sampler", daemon=True)
        self._thread.start()
        log.info(
            "telemetry: %s; host %s -> %s",
            f"{len(self._gpus)} GPU(s) every {self._gpu_iv * 1000:.0f} ms "
            f"(PCIe every {self._pcie_iv:g} s)" if self._gpus else "no GPU",
            f"every {self._host_iv:g} s" if self._host else "not sampled",
            self.csv_path,
        )  # fmt: skip

    def _open_nvml(self) -> None:
        if self._nvml is None:
            log.info("telemetry: NVML (nvidia-ml-py) not available; sampling the host only")
            return
        ok, reason = init_nvml(self._nvml)
        if not ok:
            log.info("telemetry: %s; sampling the host only", reason)
            return
        self._nvml_ok = True
        self._gpus = open_gpus(self._nvml)
        if not self._gpus:
            log.info("telemetry: NVML sees no GPU; sampling the host only")
            return
        for dev in self._gpus:
            info = dev.info
            log.info(
                "telemetry: GPU %d %s (%s MiB)%s",
                info.index, info.name, info.memory_total_mib,
                f", unsupported: {', '.join(info.unsupported)}" if info.unsupported else "",
            )  # fmt: skip

    def _open_csv(self) -> None:
        path = self.csv_path
        path.parent.mkdir(parents=True, exist_ok=True)
        header = ",".join(TELEMETRY_COLUMNS)
        append = False
        if path.exists() and path.stat().st_size > 0:
            with path.open(newline="") as fh:
                first = fh.readline().rstrip("\r\n")
            if first == header:
                append = True
            else:
                aside = path.with_name(f"{path.stem}.{int(time.time())}{path.suffix}")
                path.rename(aside)
                log.warning("telemetry: %s had another header; moved to %s", path, aside)
        self._fh = path.open("a" if append else "w", newline="")
        self._writer = csv.DictWriter(self._fh, fieldnames=TELEMETRY_COLUMNS, restval="")
        if not append:
            self._writer.writeheader()
        self._fh.flush()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> SamplerStats:
        """Close the current job with a last read, flush, shut NVML down; return the stats.

        Safe to call twice. A thread stuck inside NVML past timeout_s is left behind (it is
        a daemon) with a warning; the run goes on.
        """
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._requests.put(_Request("stop", None, None))
            self._wake.set()
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("telemetry: sampler thread did not stop within %.0f s", timeout_s)
                return self.stats()
        if self._nvml_ok and self._nvml is not None:
            self._nvml_ok = False
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:
                log.debug("telemetry: nvmlShutdown: %s", exc)
        if self._stopped_perf is None and self._started_perf is not None:
            self._stopped_perf = time.perf_counter()
            stats = self.stats()
            log.info(
                "telemetry: %d rows in %.1f s; sampler CPU %.3f s = %.3f CPU-s per minute "
                "(%.2f%% of one core); %d NVML errors, %d overruns",
                stats.rows_written, stats.wall_s, stats.cpu_s, stats.cpu_s_per_min or 0.0,
                (stats.cpu_s_per_min or 0.0) / 60 * 100, stats.nvml_errors, stats.overruns,
            )  # fmt: skip
        return self.stats()

    # -- what the runner calls -----------------------------------------------------------

    def set_job(self, job_id: str | None, timeout_s: float = SWITCH_TIMEOUT_S) -> None:
        """Tag rows from now on with job_id (None: between jobs).

        Waits (up to timeout_s) until the thread has taken the closing read of the previous
        job and the opening read of this one, so the job's energy spans its whole run.
        """
        if job_id is not None and (not isinstance(job_id, str) or not job_id):
            raise ValueError(f"job id must be a non-empty string or None, got {job_id!r}")
        if not self._running():
            with self._lock:
                self._job = job_id
                if job_id is not None:
                    self._jobs.setdefault(job_id, JobAccumulator(job_id)).open_segment()
            return
        done = threading.Event()
        self._requests.put(_Request("job", job_id, done))
        self._wake.set()
        if not done.wait(timeout_s):
            log.warning("telemetry: switch to job %r not confirmed in %.1f s", job_id, timeout_s)

    def track_process(self, pid: int | None) -> None:
        """Follow the engine's process tree rooted at pid in the host rows (None: stop)."""
        if not self._running():
            self._pending_pid = pid
            if self._host is not None:
                self._host.follow(pid)
            return
        self._requests.put(_Request("pid", pid, None))
        self._wake.set()

    @property
    def current_job(self) -> str | None:
        with self._lock:
            return self._job

    @property
    def devices(self) -> list[GpuDeviceInfo]:
        """The GPUs sampled (for the manifest); empty without NVML or GPU."""
        return [d.info for d in self._gpus]

    def summary(self, job_id: str, output_tokens: int | None = None) -> TelemetrySummary:
        """Telemetry of job_id so far; a job never sampled gets an empty summary."""
        with self._lock:
            acc = self._jobs.get(job_id)
            if acc is None:
                return TelemetrySummary(job_id=job_id, output_tokens=output_tokens)
            return acc.summary(output_tokens)

    def stats(self) -> SamplerStats:
        start = self._started_perf
        end = self._stopped_perf if self._stopped_perf is not None else time.perf_counter()
        wall_s = max(0.0, end - start) if start is not None else 0.0
        return SamplerStats(
            wall_s=wall_s,
            cpu_s=self._cpu_s,
            cpu_s_per_min=self._cpu_s / (wall_s / 60) if wall_s > 0 else None,
            gpu_count=len(self._gpus),
            nvml=bool(self._gpus),
            psutil=self._host is not None,
            gpu_interval_s=self._gpu_iv,
            host_interval_s=self._host_iv,
            pcie_interval_s=self._pcie_iv,
            gpu_passes=self._gpu_passes,
            host_passes=self._host_passes,
            rows_written=self._rows,
            overruns=self._overruns,
            nvml_errors=sum(d.errors for d in self._gpus),
            internal_errors=self._internal_errors,
            csv_errors=self._csv_errors,
        )

    # -- the thread ----------------------------------------------------------------------

    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        try:
            self._loop(cpu0)
        except Exception:  # every pass is guarded; this is the last net, not a code path
            self._internal_errors += 1
            log.exception("telemetry: sampler loop failed; no more rows this run")
        finally:
            self._cpu_s = time.thread_time() - cpu0
            self._close_csv()

    def _loop(self, cpu0: float) -> None:
        now = time.perf_counter()
        next_gpu = now if self._gpus else math.inf
        next_host = now if self._host is not None else math.inf
        next_pcie = now
        next_energy = now
        # One GPU's PCIe per slow pass, so slow passes come n times as often for n GPUs.
        pcie_every = max(self._gpu_iv, self._pcie_iv / max(1, len(self._gpus)))
        next_flush = now + self._flush_iv
        while True:  # ends on a stop request; each turn sleeps until the next deadline
            if self._drain_requests():
                return
            now = time.perf_counter()
            if now >= next_gpu:
                slow = now >= next_pcie
                per_second = now >= next_energy
                self._gpu_pass(slow, per_second)
                if per_second:
                    next_energy = self._next(next_energy, self._energy_iv, now, count=False)
                if slow:
                    next_pcie = self._next(next_pcie, pcie_every, now, count=False)
                next_gpu = self._next(next_gpu, self._gpu_iv, time.perf_counter())
            if now >= next_host:
                self._host_pass()
                next_host = self._next(next_host, self._host_iv, time.perf_counter())
            if time.perf_counter() >= next_flush:
                self._flush()
                next_flush = time.perf_counter() + self._flush_iv
            self._cpu_s = time.thread_time() - cpu0
            delay = min(next_gpu, next_host, next_flush) - time.perf_counter()
            if delay > 0:
                self._wake.wait(delay)
            # Cleared after waking and before draining: a request put in between is still seen.
            self._wake.clear()

    def _next(self, deadline: float, interval: float, now: float, count: bool = True) -> float:
        """Fixed-rate schedule (no drift); a pass more than one interval late is skipped."""
        nxt = deadline + interval
        if nxt <= now:
            if count:
                self._overruns += 1
            nxt = now + interval
        return nxt

    def _drain_requests(self) -> bool:
        stop = False
        while True:
            try:
                req = self._requests.get_nowait()
            except queue.Empty:
                return stop
            try:
                if req.kind == "job":
                    self._switch_job(req.value)
                elif req.kind == "pid":
                    if self._host is not None:
                        self._host.follow(req.value)
                else:
                    self._switch_job(None)
                    stop = True
            except Exception:
                self._internal_error("request", f"handling {req.kind} request failed")
            finally:
                if req.done is not None:
                    req.done.set()

    def _switch_job(self, new: str | None) -> None:
        old = self._job
        if new == old:
            return
        if old is not None:
            self._boundary_pass()  # the closing read of the old job
        with self._lock:
            self._job = new
            if new is not None:
                self._jobs.setdefault(new, JobAccumulator(new)).open_segment()
        if new is not None:
            self._boundary_pass()  # the opening read of the new one

    def _boundary_pass(self) -> None:
        if self._gpus:
            self._gpu_pass(slow=False)  # PCIe would add ~40 ms per GPU to set_job
        if self._host is not None:
            self._host_pass()

    def _gpu_pass(self, slow: bool, per_second: bool = True) -> None:
        self._gpu_passes += 1
        job = self._job
        slow_index = -1
        if slow and self._gpus:
            slow_index = self._pcie_turn % len(self._gpus)
            self._pcie_turn += 1
        for i, dev in enumerate(self._gpus):
            try:
                sample = dev.read(job, with_slow=i == slow_index, with_per_second=per_second)
            except Exception:
                self._internal_error(f"gpu{dev.index}", f"reading GPU {dev.index} failed")
                continue
            if sample is not None:
                self._emit(sample)

    def _host_pass(self) -> None:
        if self._host is None:
            return
        self._host_passes += 1
        try:
            sample = self._host.read(self._job)
        except Exception:
            self._internal_error("host", "reading the host failed")
            return
        self._emit(sample)

    def _internal_error(self, key: str, message: str) -> None:
        self._internal_errors += 1
        if key in self._warned:
            log.debug("telemetry: %s", message, exc_info=True)
        else:
            self._warned.add(key)
            log.warning("telemetry: %s (warned once)", message, exc_info=True)

    def _emit(self, sample: Sample) -> None:
        if sample.job_id is not None:
            with self._lock:
                acc = self._jobs.get(sample.job_id)
                if acc is not None:
                    acc.add(sample)
        if self._writer is None:
            return
        try:
            self._writer.writerow(sample.to_row())
            self._rows += 1
        except (OSError, ValueError) as exc:
            self._csv_errors += 1
            self._writer = None
            log.error(
                "telemetry: writing %s failed (%s); no more rows, job summaries go on",
                self.csv_path, exc,
            )  # fmt: skip

    def _flush(self) -> None:
        if self._fh is None or self._writer is None:
            return
        try:
            self._fh.flush()
        except OSError as exc:
            self._csv_errors += 1
            self._writer = None
            log.error("telemetry: flushing %s failed (%s); no more rows", self.csv_path, exc)

    def _close_csv(self) -> None:
        self._flush()
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as exc:
                log.error("telemetry: closing %s failed: %s", self.csv_path, exc)
            self._fh = None
            self._writer = None
