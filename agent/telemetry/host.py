"""psutil side of telemetry: the host (CPU, RAM, disk and network counters) and the engine's
process tree (RSS and CPU of the root and all its descendants).

CPU percentages are computed from CPU-time deltas kept here, not with
`psutil.cpu_percent(None)`, whose "since the last call" state is global to the process and
would be shortened by anyone else calling it. A process first seen in a pass is measured
from its creation, so a fresh engine child is not read as 0 %.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from contract.telemetry_samples import HostSample

__all__ = ["HostProbe", "load_psutil"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# A process seen for the first time less than this after it started gives a noisy
# percentage (create_time has 10 ms resolution); its CPU counts from the next pass.
_MIN_WINDOW_S = 0.05


def load_psutil() -> Any | None:
    """The psutil module, or None (the GPU check script may run where it is missing)."""
    # Imported here so the sampler also runs (GPU only) where psutil is not installed.
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def _busy_and_total(times: Any) -> tuple[float, float]:
    total = float(sum(times))
    if sys.platform.startswith("linux"):
        # Linux counts guest time inside user/nice too (psutil does the same subtraction).
        total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class HostProbe:
    """Reads the host and the engine tree; keeps the previous CPU times for percentages.

    Not thread-safe: only the sampler thread calls `read`.
    """

    def __init__(self, psutil_mod: Any) -> None:
        self._ps = psutil_mod
        self._prev_cpu: tuple[float, float] | None = None
        # (pid, create_time) -> (cpu seconds, wall time) at the previous pass
        self._prev_proc: dict[tuple[int, float], tuple[float, float]] = {}
        self._root: Any | None = None
        self._root_pid: int | None = None
        self._disk = self._probe("disk_io_counters")
        self._net = self._probe("net_io_counters")
        self.errors = 0
        self._warned: set[str] = set()
        try:
            # Seed the CPU times so the first row already has a percentage.
            self._prev_cpu = _busy_and_total(psutil_mod.cpu_times())
        except Exception:
            self._prev_cpu = None

    def _probe(self, fn_name: str) -> bool:
        try:
            ok = getattr(self._ps, fn_name)() is not None
        except Exception as exc:
            log.info("psutil %s unavailable here (%s); columns left empty", fn_name, exc)
            return False
        if not ok:
            # Containers without /proc/diskstats answer None: not an error.
            log.info("psutil %s unavailable here; columns left empty", fn_name)
        return ok

    def _warn_once(self, key: str, message: str) -> None:
        self.errors += 1
        if key in self._warned:
            log.debug("host telemetry: %s", message)
            return
        self._warned.add(key)
        log.warning("host telemetry: %s (warned once)", message)

    def follow(self, pid: int | None) -> None:
        """Follow the process tree rooted at pid from the next pass on (None: stop)."""
        self._root, self._root_pid = None, pid
        self._prev_proc.clear()
        if pid is None:
            return
        try:
            self._root = self._ps.Process(pid)
        except self._ps.Error as exc:
            log.info("engine process %d not found (%s); engine columns left empty", pid, exc)

    def read(self, job_id: str | None) -> HostSample:
        unix_s = time.time()
        perf_ns = time.perf_counter_ns()
        values: dict[str, float | int | None] = {}
        try:
            busy, total = _busy_and_total(self._ps.cpu_times())
            if self._prev_cpu is not None and total > self._prev_cpu[1]:
                d_busy, d_total = busy - self._prev_cpu[0], total - self._prev_cpu[1]
                values["cpu_pct"] = round(max(0.0, min(100.0, 100.0 * d_busy / d_total)), 1)
            self._prev_cpu = (busy, total)
            vm = self._ps.virtual_memory()
            values["ram_used_mib"] = round((vm.total - vm.available) / MIB, 1)
            values["ram_pct"] = float(vm.percent)
        except Exception as exc:
            self._warn_once("cpu/ram", f"cpu/ram read failed: {exc}")
        if self._disk:
            try:
                disk = self._ps.disk_io_counters()
                values["disk_read_bytes"] = int(disk.read_bytes)
                values["disk_write_bytes"] = int(disk.write_bytes)
            except Exception as exc:
                self._warn_once("disk", f"disk counters read failed: {exc}")
        if self._net:
            try:
                net = self._ps.net_io_counters()
                values["net_rx_bytes"] = int(net.bytes_recv)
                values["net_tx_bytes"] = int(net.bytes_sent)
            except Exception as exc:
                self._warn_once("net", f"network counters read failed: {exc}")
        if self._root_pid is not None:
            values["engine_pid"] = self._root_pid
            values.update(self._read_tree(unix_s))
        return HostSample(
            time_unix_s=unix_s, time_perf_ns=perf_ns, job_id=job_id,
            # Ignored below: values maps the sample's optional psutil fields by name.
            **values,  # type: ignore[arg-type]
        )  # fmt: skip

    def _read_tree(self, now: float) -> dict[str, float | int | None]:
        if self._root is None:
            return {}
        ps = self._ps
        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except ps.NoSuchProcess:
            # Said once: with the root gone, later passes return before getting here.
            log.info("engine process %s has exited; engine columns left empty", self._root_pid)
            self._root = None
            self._prev_proc.clear()
            return {}
        except ps.Error as exc:
            self._warn_once("tree", f"engine process tree unreadable: {exc}")
            return {}
        rss = 0
        cpu_pct = 0.0
        seen = 0
        current: dict[tuple[int, float], tuple[float, float]] = {}
        for proc in procs:
            try:
                with proc.oneshot():
                    created = proc.create_time()
                    times = proc.cpu_times()
                    rss += proc.memory_info().rss
            except ps.Error:
                continue  # exited (or became a zombie) between listing and reading
            seen += 1
            cpu_s = times.user + times.system
            key = (proc.pid, created)
            prev_cpu_s, prev_wall = self._prev_proc.get(key, (0.0, created))
            window = now - prev_wall
            if window >= _MIN_WINDOW_S:
                cpu_pct += 100.0 * max(0.0, cpu_s - prev_cpu_s) / window
                current[key] = (cpu_s, now)
            else:
                current[key] = (prev_cpu_s, prev_wall)
        self._prev_proc = current
        return {
            "engine_procs": seen,
            "engine_rss_mib": round(rss / MIB, 1),
            "engine_cpu_pct": round(cpu_pct, 1),
        }
