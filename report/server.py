"""What the server saw during the sweep, where the agent recorded the engine's own metrics:
the level at which requests start waiting in the server's queue, and the peak KV-cache use.

Server rows are read from `server_metrics.csv` (the agent's poller) and `telemetry.csv` as
written, by column name, so this works with whatever columns a recorded file has: rows
whose `source` is "server", with requests
waiting (`requests_waiting`, `num_requests_waiting`), running (`requests_running`,
`num_requests_running`) and KV-cache use in percent (`kv_cache_usage_pct`, `kv_cache_pct`;
the poller's and vLLM's 0..1 `kv_cache_usage`/`gpu_cache_usage_perc`/`kv_cache_usage_perc`
scaled to percent). A sweep
cell's windows are placed on the samples' perf-counter axis as `report.energy` places them
(each window ends at its last measured finish and lasts its duration); a cell queued when
any sample inside one of its windows had a request waiting.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from report.energy import window_spans
from report.load import CampaignResults, ShardResults, requests_path
from report.rows import WaitRow

__all__ = ["ServerSample", "read_server_samples", "server_samples", "wait_rows"]

_WAITING = ("requests_waiting", "num_requests_waiting")
_RUNNING = ("requests_running", "num_requests_running")
_KV_PCT = ("kv_cache_usage_pct", "kv_cache_pct")
_KV_FRACTION = ("kv_cache_usage", "gpu_cache_usage_perc", "kv_cache_usage_perc")


@dataclass(frozen=True, slots=True)
class ServerSample:
    time_unix_s: float
    time_perf_ns: int
    job_id: str
    waiting: float | None
    running: float | None
    kv_pct: float | None


def _number(row: dict[str, str], names: tuple[str, ...]) -> float | None:
    for name in names:
        text = (row.get(name) or "").strip()
        if text:
            try:
                return float(text)
            except ValueError:
                return None
    return None


def read_server_samples(path: Path) -> list[ServerSample]:
    """Every server row of a telemetry.csv; none where the file has no such rows."""
    out = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("source") != "server":
                continue
            try:
                unix_s, perf_ns = float(row["time_unix_s"]), int(row["time_perf_ns"])
            except (KeyError, ValueError):
                continue
            fraction = _number(row, _KV_FRACTION)
            kv = _number(row, _KV_PCT)
            out.append(
                ServerSample(
                    time_unix_s=unix_s,
                    time_perf_ns=perf_ns,
                    job_id=row.get("job_id") or "",
                    waiting=_number(row, _WAITING),
                    running=_number(row, _RUNNING),
                    kv_pct=kv
                    if kv is not None
                    else (fraction * 100 if fraction is not None else None),
                )
            )
    return out


def server_samples(shard: ShardResults) -> list[ServerSample]:
    """The shard's server rows from both files, in time order."""
    samples = [
        sample
        for path in (shard.server_metrics_path, shard.telemetry_path)
        if path is not None
        for sample in read_server_samples(path)
    ]
    return sorted(samples, key=lambda s: s.time_perf_ns)


def wait_rows(campaign: CampaignResults, shapes: Sequence[str]) -> list[WaitRow]:
    rows = []
    for shard in campaign.shards:
        samples = server_samples(shard)
        if not samples:
            continue
        for arm in shard.arms:
            record, requests = arm.jobs.get("sweep"), requests_path(arm, "sweep")
            if arm.sweep is None or record is None or requests is None:
                continue
            mine = sorted(
                (s for s in samples if s.job_id == record.job_id), key=lambda s: s.time_perf_ns
            )
            last = window_spans(requests)
            for shape in shapes:
                first: int | None = None
                peak_waiting: float | None = None
                peak_kv: float | None = None
                seen = 0
                for cell in sorted(
                    (c for c in arm.sweep.cells if c.shape == shape), key=lambda c: c.concurrency
                ):
                    inside: list[ServerSample] = []
                    for window in cell.repeats:
                        end = last.get(cell.window_label(window.repeat))
                        if end is None:
                            continue
                        start = end - round(window.duration_s * 1e9)
                        inside += [s for s in mine if start <= s.time_perf_ns <= end]
                    if not inside:
                        continue
                    seen += 1
                    waiting = [s.waiting for s in inside if s.waiting is not None]
                    kv = [s.kv_pct for s in inside if s.kv_pct is not None]
                    if waiting and max(waiting) > 0 and first is None:
                        first = cell.concurrency
                    if waiting:
                        peak_waiting = max(peak_waiting or 0.0, *waiting)
                    if kv:
                        peak_kv = max(peak_kv or 0.0, *kv)
                if seen:
                    rows.append(WaitRow(arm.label, shape, first, peak_waiting, peak_kv, seen))
    return rows
