"""Joules per output token for each sweep cell, from the NVML energy counter in telemetry.csv.

A job's `TelemetrySummary` gives J/token for the whole job; a sweep job spans every level,
so the per-level figure needs the counter over each cell's measured windows. A window's
span is taken from the records it was computed from: it ends at the last finish among its
measured requests and lasts the window's `duration_s` (for a burst that is exactly first
send -> last finish; for a steady window, its fixed length ending at the last finish
counted). The energy is the counter's delta between the last GPU sample at or before the
window's start and the first at or after its end, folded by `contract.telemetry_summary`
(the same code as the per-job figure: counter resets handled, GPUs summed, None unless
every GPU had the counter). So up to one sample period (100 ms) of the idle gap at each
edge is included; the report says so. J/token of a cell = the energy of its measured
windows / their output tokens (warm-up bursts excluded from both).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from contract.results import CellResult, SweepSummary
from contract.telemetry_samples import GpuSample, read_telemetry_csv
from contract.telemetry_summary import summarize
from report.load import ITEMS, CampaignResults, requests_path
from report.rows import EnergyCell, JobEnergy, SweepGrid

__all__ = [
    "CellEnergy",
    "GpuSeries",
    "cell_energy",
    "energy_rows",
    "read_gpu_series",
    "sweep_energy",
    "window_spans",
]


@dataclass(frozen=True, slots=True)
class CellEnergy:
    shape: str
    concurrency: int
    energy_j: float
    output_tokens: int
    windows: int

    @property
    def joules_per_token(self) -> float | None:
        return self.energy_j / self.output_tokens if self.output_tokens > 0 else None


@dataclass(frozen=True)
class GpuSeries:
    """GPU samples of one job, in time order (perf ns), for slicing by window."""

    job_id: str
    samples: list[GpuSample]
    times: list[int]

    def between(self, start_ns: int, end_ns: int) -> list[GpuSample]:
        """The samples that bracket [start, end]: from the last at or before the start to
        the first at or after the end."""
        low = max(0, bisect_right(self.times, start_ns) - 1)
        high = min(len(self.times), bisect_left(self.times, end_ns) + 1)
        return self.samples[low:high]


def read_gpu_series(path: Path, job_ids: Iterable[str]) -> dict[str, GpuSeries]:
    """GPU samples of the given jobs from telemetry.csv (other rows skipped)."""
    wanted = set(job_ids)
    grouped: dict[str, list[GpuSample]] = defaultdict(list)
    for sample in read_telemetry_csv(path):
        if isinstance(sample, GpuSample) and sample.job_id in wanted:
            grouped[sample.job_id].append(sample)
    out = {}
    for job_id, samples in grouped.items():
        samples.sort(key=lambda s: s.time_perf_ns)
        out[job_id] = GpuSeries(job_id, samples, [s.time_perf_ns for s in samples])
    return out


def window_spans(requests_jsonl: Path) -> dict[str, int]:
    """Last finish (perf ns) of each measured label ('in512-out128/c8/r2'), ok requests only.

    Reads only the few fields needed: a long sweep's requests.jsonl holds every chunk time.
    """
    last: dict[str, int] = {}
    with requests_jsonl.open("rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            record = orjson.loads(line)
            if record.get("phase") != "measured" or record.get("error"):
                continue
            finish = record.get("last_token_ns") or record.get("end_ns")
            if finish is None:
                continue
            label = record["label"]
            if finish > last.get(label, 0):
                last[label] = finish
    return last


def cell_energy(
    cell: CellResult, job_id: str, series: GpuSeries, last_finish: dict[str, int]
) -> CellEnergy | None:
    """Energy over the cell's measured windows, or None where any window lacks a reading."""
    if cell.status != "ok" or not cell.repeats:
        return None
    total_j = 0.0
    tokens = 0
    for window in cell.repeats:
        end_ns = last_finish.get(cell.window_label(window.repeat))
        if end_ns is None or window.duration_s <= 0:
            return None
        start_ns = end_ns - round(window.duration_s * 1e9)
        energy = summarize(job_id, series.between(start_ns, end_ns)).energy_j
        if energy is None:
            return None
        total_j += energy
        tokens += window.output_tokens
    return CellEnergy(cell.shape, cell.concurrency, total_j, tokens, len(cell.repeats))


def sweep_energy(
    summary: SweepSummary, job_id: str, series: GpuSeries | None, requests_jsonl: Path | None
) -> dict[tuple[str, int], CellEnergy]:
    """Every cell's energy that can be had; cells without a reading are left out here and
    shown as not measured by the table."""
    if series is None or requests_jsonl is None:
        return {}
    last = window_spans(requests_jsonl)
    out = {}
    for cell in summary.cells:
        energy = cell_energy(cell, job_id, series, last)
        if energy is not None:
            out[(cell.shape, cell.concurrency)] = energy
    return out


def energy_rows(
    campaign: CampaignResults, grids: Sequence[SweepGrid]
) -> tuple[list[EnergyCell], list[JobEnergy], bool]:
    cells: list[EnergyCell] = []
    jobs: list[JobEnergy] = []
    sampled = False
    for shard in campaign.shards:
        sweeps = {a.jobs["sweep"].job_id: a for a in shard.arms if a.sweep and "sweep" in a.jobs}
        series: dict[str, GpuSeries] = {}
        if shard.telemetry_path:
            try:
                series = read_gpu_series(shard.telemetry_path, sweeps)
            except ValueError:
                # A telemetry.csv of another layout: its GPU energy is not read (the
                # caveats say energy was not measured), the rest of the report stands.
                series = {}
        for arm in shard.arms:
            for item in (i for i in ITEMS if i in arm.jobs):
                telemetry = arm.telemetry(item)
                if telemetry is None:
                    continue
                sampled = sampled or telemetry.gpu_samples > 0
                jobs.append(
                    JobEnergy(
                        label=arm.label,
                        item=item,
                        joules_per_token=telemetry.joules_per_output_token,
                        energy_j=telemetry.energy_j,
                        output_tokens=telemetry.output_tokens,
                        mean_power_w=telemetry.mean_power_w,
                        gpu_samples=telemetry.gpu_samples,
                    )
                )
        for job_id, arm in sweeps.items():
            assert arm.sweep is not None
            found: dict[tuple[str, int], CellEnergy] = sweep_energy(
                arm.sweep, job_id, series.get(job_id), requests_path(arm, "sweep")
            )
            for grid in grids:
                for level in grid.levels:
                    energy = found.get((grid.shape, level))
                    cells.append(
                        EnergyCell(
                            label=arm.label,
                            shape=grid.shape,
                            concurrency=level,
                            joules_per_token=energy.joules_per_token if energy else None,
                            energy_j=energy.energy_j if energy else None,
                            output_tokens=energy.output_tokens if energy else None,
                        )
                    )
    return cells, jobs, sampled
