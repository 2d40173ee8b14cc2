"""Telemetry samples in memory and as `telemetry.csv` rows (columns: contract.telemetry).

A `GpuSample` is one NVML read of one GPU at one instant; a `HostSample` one psutil read of
the host and of the engine's process tree. `None` means the value was not read (not
supported, or the read failed); in the CSV it is an empty cell.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from contract.telemetry import GPU_COLUMNS, HOST_COLUMNS, TELEMETRY_COLUMNS, TelemetrySource

__all__ = ["GpuSample", "HostSample", "Sample", "read_telemetry_csv"]

# Columns parsed back as int (the rest of the numeric columns are float).
_INT_COLUMNS = frozenset(
    {
        "time_perf_ns",
        "gpu_index",
        "energy_mj",
        "sm_clock_mhz",
        "mem_clock_mhz",
        "throttle_reasons",
        "pcie_rx_kb_s",
        "pcie_tx_kb_s",
        "disk_read_bytes",
        "disk_write_bytes",
        "net_rx_bytes",
        "net_tx_bytes",
        "engine_pid",
        "engine_procs",
    }
)


def _cell(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        # Six decimals are finer than any sensor here (and than a microsecond of wall clock)
        # and keep rows short; repr of the rounded value drops trailing zeros.
        return repr(round(value, 6))
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSample:
    """One GPU at one instant (NVML)."""

    time_unix_s: float
    time_perf_ns: int
    job_id: str | None
    gpu_index: int
    gpu_util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_mib: float | None = None
    power_w: float | None = None
    energy_mj: int | None = None
    temp_c: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    throttle_reasons: int | None = None
    pcie_rx_kb_s: int | None = None
    pcie_tx_kb_s: int | None = None

    source: TelemetrySource = dataclasses.field(default="gpu", init=False)

    def to_row(self) -> dict[str, object]:
        return {name: _cell(getattr(self, name)) for name in _GPU_ROW}


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSample:
    """The host and the engine's process tree at one instant (psutil)."""

    time_unix_s: float
    time_perf_ns: int
    job_id: str | None
    cpu_pct: float | None = None
    ram_used_mib: float | None = None
    ram_pct: float | None = None
    disk_read_bytes: int | None = None
    disk_write_bytes: int | None = None
    net_rx_bytes: int | None = None
    net_tx_bytes: int | None = None
    engine_pid: int | None = None
    engine_procs: int | None = None
    engine_rss_mib: float | None = None
    engine_cpu_pct: float | None = None

    source: TelemetrySource = dataclasses.field(default="host", init=False)

    def to_row(self) -> dict[str, object]:
        return {name: _cell(getattr(self, name)) for name in _HOST_ROW}


Sample = GpuSample | HostSample

_COMMON = ("time_unix_s", "time_perf_ns", "job_id", "source")
_GPU_ROW = _COMMON + GPU_COLUMNS
_HOST_ROW = _COMMON + HOST_COLUMNS


def _parse(column: str, text: str) -> object:
    if text == "":
        return None
    if column in ("job_id", "source"):
        return text
    return int(text) if column in _INT_COLUMNS else float(text)


def read_telemetry_csv(path: Path) -> Iterator[Sample]:
    """The samples of a `telemetry.csv`, in file order.

    Raises:
        ValueError: the header is not `contract.telemetry.TELEMETRY_COLUMNS`, or a row
            names an unknown source.
    """
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            return
        if tuple(header) != TELEMETRY_COLUMNS:
            raise ValueError(f"{path}: header {header} is not the telemetry.csv header")
        for lineno, row in enumerate(reader, start=2):
            cells = dict(zip(header, row, strict=True))
            source = cells["source"]
            if source == "gpu":
                names = _GPU_ROW
            elif source == "host":
                names = _HOST_ROW
            else:
                raise ValueError(f"{path}:{lineno}: unknown source {source!r}")
            values = {n: _parse(n, cells[n]) for n in names if n != "source"}
            # Ignored below: the CSV's column names are the sample's fields, checked by
            # _HOST_ROW/_GPU_ROW above.
            yield GpuSample(**values) if source == "gpu" else HostSample(**values)  # type: ignore[arg-type]
