"""`cells.csv`: one row per sweep cell and repeat, every metric, for spreadsheets and pandas.

A row is one measured window of one cell of one arm; a cell with no window (infeasible,
failed, or a job that left no summary) is one row with its status and reason and empty
metrics, so nothing is dropped. Columns come from the records themselves: each window's
scalar fields, each distribution's fields as `<metric>_<field>` (e.g. `ttft_ms_p99`), so
a field the agent gains (rate mode, acceptance) gains its column without a change here.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from pathlib import Path

from report.arms import engine_name
from report.load import ArmResults

__all__ = ["CELLS_CSV", "cell_rows", "write_cells_csv"]

CELLS_CSV = "cells.csv"
_LEAD = (
    "arm",
    "site",
    "shard",
    "instance_type",
    "engine",
    "shape",
    "input_tokens",
    "output_tokens",
    "concurrency",
    "mode",
    "cell_status",
    "cell_reason",
    "repeat",
)

Value = str | int | float | bool | None


def _flat(data: dict[str, object], prefix: str = "") -> Iterator[tuple[str, Value]]:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flat(value, f"{name}_")
        elif isinstance(value, list | tuple):
            yield name, " | ".join(str(v) for v in value)
        elif value is None or isinstance(value, str | int | float | bool):
            yield name, value
        else:
            yield name, str(value)


def cell_rows(arms: Sequence[ArmResults]) -> list[dict[str, Value]]:
    rows: list[dict[str, Value]] = []
    for arm in arms:
        head: dict[str, Value] = {
            "arm": arm.label,
            "site": arm.where,
            "shard": arm.shard,
            "instance_type": arm.instance_type,
            "engine": engine_name(arm),
        }
        if arm.sweep is None:
            if arm.status("sweep") != "not run" or "sweep" in arm.job_dirs:
                reason = arm.reason("sweep") or "no readable summary.json"
                rows.append(head | {"cell_status": "job failed", "cell_reason": reason})
            continue
        for cell in arm.sweep.cells:
            base = head | {
                "shape": cell.shape,
                "input_tokens": cell.input_tokens,
                "output_tokens": cell.output_tokens,
                "concurrency": cell.concurrency,
                "mode": cell.mode,
                "cell_status": cell.status,
                "cell_reason": cell.reason,
            }
            # Cell-level fields beyond the lead (rate mode, medians) where the record has them.
            extra = cell.model_dump(exclude={"repeats", *_LEAD, "status", "reason"})
            base |= {f"cell_{k}": v for k, v in _flat(extra)}
            if not cell.repeats:
                rows.append(base)
                continue
            for window in cell.repeats:
                data = window.model_dump(exclude={"repeat", "mode", "concurrency"})
                rows.append(base | {"repeat": window.repeat} | dict(_flat(data)))
    return rows


def write_cells_csv(arms: Sequence[ArmResults], out: Path) -> Path:
    rows = cell_rows(arms)
    columns = list(_LEAD)
    for row in rows:
        columns += [k for k in row if k not in columns]
    path = out / CELLS_CSV
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="raise")
        writer.writeheader()
        writer.writerows(rows)
    return path
