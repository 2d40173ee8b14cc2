"""Telemetry records: the columns of `telemetry.csv`, the per-job telemetry summary, and the
sampler's own cost, as the agent writes them and reports read them.

`telemetry.csv` (one per shard, docs/DESIGN.md "Results layout") is one wide table: a row is
either one GPU read at one instant (`source` = "gpu", NVML, every 100 ms per GPU) or one
host read (`source` = "host", psutil, every second). Columns of the other source are empty,
and so is any value NVML or psutil could not give. Every row carries the job running when
it was taken (`job_id`, empty between jobs), a wall-clock time (`time_unix_s`, to line up
with other machines and logs) and a `time.perf_counter_ns()` time (`time_perf_ns`, the same
clock as the request records, for deltas).

Counters are written raw: `energy_mj` is NVML's total-energy counter (millijoules since the
driver loaded), `disk_*_bytes` and `net_*_bytes` are psutil's cumulative counters. Rates and
energies are derived later, from deltas.

Stdlib dataclasses rather than pydantic on purpose: the sampler (and this module) must
import on a GPU machine that has only torch and nvidia-ml-py (benchmarks/
telemetry_gpu_check.py runs there). Pydantic models elsewhere can embed these dataclasses
as field types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

__all__ = [
    "COMMON_COLUMNS",
    "GPU_COLUMNS",
    "HOST_COLUMNS",
    "SERVER_METRICS_FILE",
    "TELEMETRY_COLUMNS",
    "TELEMETRY_FILE",
    "GpuDeviceInfo",
    "GpuTelemetrySummary",
    "SamplerStats",
    "TelemetrySource",
    "TelemetrySummary",
]

TELEMETRY_FILE = "telemetry.csv"
# The server's own /metrics, one row per reading, beside telemetry.csv (source "server").
SERVER_METRICS_FILE = "server_metrics.csv"
TelemetrySource = Literal["gpu", "host"]

COMMON_COLUMNS: tuple[str, ...] = ("time_unix_s", "time_perf_ns", "job_id", "source")
GPU_COLUMNS: tuple[str, ...] = (
    "gpu_index",
    "gpu_util_pct",  # % of the last sample period a kernel ran (NVML utilization.gpu)
    "mem_util_pct",  # % of that period device memory was read or written
    "mem_used_mib",
    "power_w",  # nvmlDeviceGetPowerUsage (on A100/H100-class GPUs a ~1 s average)
    "energy_mj",  # nvmlDeviceGetTotalEnergyConsumption: counter since driver load
    "temp_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "throttle_reasons",  # clocks event (throttle) reasons bitmask, decimal
    "pcie_rx_kb_s",  # NVML samples each over 20 ms; read at the PCIe cadence only
    "pcie_tx_kb_s",
)
HOST_COLUMNS: tuple[str, ...] = (
    "cpu_pct",  # whole host, 0..100, over the time since the previous host row
    "ram_used_mib",  # total - available
    "ram_pct",
    "disk_read_bytes",  # cumulative, all disks
    "disk_write_bytes",
    "net_rx_bytes",  # cumulative, all interfaces
    "net_tx_bytes",
    "engine_pid",  # root of the engine process tree being followed
    "engine_procs",  # processes in that tree at this row
    "engine_rss_mib",  # sum of RSS over the tree (shared pages count once per process)
    "engine_cpu_pct",  # sum over the tree; 100 = one core busy
)
TELEMETRY_COLUMNS: tuple[str, ...] = COMMON_COLUMNS + GPU_COLUMNS + HOST_COLUMNS

_T = TypeVar("_T")


def _from_mapping(cls: type[_T], data: Mapping[str, Any], where: str) -> _T:
    """Build dataclass `cls` from a JSON-shaped mapping; unknown or missing keys are errors."""
    # Ignored below: cls is always a dataclass here; a TypeVar cannot say so.
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuDeviceInfo:
    """One GPU as the sampler found it; `unsupported` names readings NVML refused for it."""

    index: int
    name: str
    uuid: str | None = None
    memory_total_mib: float | None = None
    unsupported: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "unsupported": list(self.unsupported)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuDeviceInfo:
        fixed = {**data, "unsupported": tuple(data.get("unsupported", ()))}
        return _from_mapping(cls, fixed, "gpu device")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuTelemetrySummary:
    """One GPU over one job. `None` = no value (not supported, or too few samples), never 0.

    energy_j is the energy counter's delta over the job (summed over consecutive samples,
    so a counter reset costs only the energy between the last reading before it and the
    reset); energy_j_power_integral is the trapezoid integral of the power samples, kept
    as a cross-check only.
    """

    index: int
    samples: int
    peak_memory_used_mib: float | None = None
    mean_power_w: float | None = None
    max_power_w: float | None = None
    mean_gpu_util_pct: float | None = None
    mean_mem_util_pct: float | None = None
    max_temp_c: float | None = None
    throttle_reasons_seen: int | None = None  # OR of every bitmask read during the job
    energy_j: float | None = None
    energy_j_power_integral: float | None = None
    energy_counter_resets: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuTelemetrySummary:
        return _from_mapping(cls, data, "gpu telemetry summary")


@dataclass(frozen=True, slots=True, kw_only=True)
class TelemetrySummary:
    """Telemetry of one job, from the samples tagged with its id.

    Across GPUs: peak_gpu_memory_mib is the highest any one GPU reached; mean_power_w,
    energy_j and energy_j_power_integral are sums over the GPUs, and `None` unless every
    GPU that was sampled had the value (a partial sum would understate J/token);
    mean_gpu_util_pct is the mean of the GPUs' means. joules_per_output_token =
    energy_j / output_tokens (the counter, not the power integral).

    Host: cpu_pct_mean and engine_cpu_pct_mean leave out the first host sample of each
    stretch of the job, whose percentage covers time before the job started.
    """

    job_id: str
    duration_s: float | None = None
    gpu_samples: int = 0
    host_samples: int = 0
    gpus: tuple[GpuTelemetrySummary, ...] = ()
    peak_gpu_memory_mib: float | None = None
    mean_power_w: float | None = None
    mean_gpu_util_pct: float | None = None
    energy_j: float | None = None
    energy_j_power_integral: float | None = None
    output_tokens: int | None = None
    joules_per_output_token: float | None = None
    cpu_pct_mean: float | None = None
    ram_used_mib_peak: float | None = None
    engine_rss_mib_peak: float | None = None
    engine_cpu_pct_mean: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["gpus"] = [g.to_dict() for g in self.gpus]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TelemetrySummary:
        gpus = tuple(GpuTelemetrySummary.from_dict(g) for g in data.get("gpus", ()))
        return _from_mapping(cls, {**data, "gpus": gpus}, "telemetry summary")


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplerStats:
    """What the sampler did and what it cost: its own thread's CPU time over its wall time.

    cpu_s_per_min = cpu_s / (wall_s / 60): CPU seconds the sampler thread used per minute of
    sampling (60 would be one core flat out). nvml_errors counts failed NVML reads other
    than 'not supported' (those are probed once and never read again).
    """

    wall_s: float
    cpu_s: float
    cpu_s_per_min: float | None
    gpu_count: int
    nvml: bool
    psutil: bool
    gpu_interval_s: float
    host_interval_s: float
    pcie_interval_s: float
    gpu_passes: int
    host_passes: int
    rows_written: int
    overruns: int  # passes that started more than one interval late
    nvml_errors: int
    internal_errors: int
    csv_errors: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplerStats:
        return _from_mapping(cls, data, "sampler stats")
