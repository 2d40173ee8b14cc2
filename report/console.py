"""The report's tables on a terminal: one renderer (rich) for `bench report`, `bench run`,
`bench probe`, `bench sweep` and `bench diff`, so what a run prints is what its report says.

`run_tables` is what a finished run prints: its jobs, then the report's one-request, sweep,
SLO and accuracy tables, built from the results folder by `report.build` as for the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from report.build import build_report
from report.folders import load_folders
from report.prices import choose_prices
from report.rows import Report
from report.tables import Table, accuracy_tables, fmt, probe_table, sweep_tables
from report.user_tables import slo_table

__all__ = [
    "jobs_table",
    "print_tables",
    "probe_table",
    "report_of",
    "run_tables",
    "sweep_tables",
    "to_rich",
]


def to_rich(table: Table) -> RichTable:
    out = RichTable(title=table.title, caption=table.caption or None, caption_justify="left")
    for i, column in enumerate(table.columns):
        out.add_column(column, justify="left" if i < table.align_left else "right")
    for r, row in enumerate(table.rows):
        out.add_row(
            *(
                Text(cell, style="dim") if (r, c) in table.muted else Text(cell)
                for c, cell in enumerate(row)
            )
        )
    return out


def jobs_table(report: Report) -> Table:
    rows = []
    records = [(arm, record) for arm in report.results.arms() for record in arm.jobs.values()]
    for arm, record in sorted(records, key=lambda pair: pair[1].started_unix_s):
        joules = record.telemetry.joules_per_output_token if record.telemetry else None
        rows.append(
            (
                record.job_id if not arm.site else f"{record.job_id}@{arm.site}",
                record.status,
                fmt(record.health_s, 2),
                fmt(record.first_completion_s, 2),
                fmt(joules, 4) if isinstance(joules, float) else "-",
                record.reason or "",
            )
        )
    return Table(
        key="jobs",
        title="Jobs",
        columns=("job", "status", "ready s", "first completion s", "J/token", "reason"),
        rows=rows,
        align_left=2,
    )


def report_of(folders: Sequence[Path]) -> Report:
    """The report's rows for results folders, with the shipped price table (no AWS call)."""
    return build_report(load_folders(folders), choose_prices("table"))


def run_tables(report: Report) -> list[Table]:
    tables = [jobs_table(report)] if any(a.jobs for a in report.results.arms()) else []
    if any(r.e2e_tok_s is not None for r in report.probe):
        tables.append(probe_table(report))
    tables += sweep_tables(report)
    headline = slo_table(report)
    tables += [headline] if headline else []
    return tables + accuracy_tables(report)


def print_tables(console: Console, tables: Sequence[Table]) -> None:
    for table in tables:
        console.print(to_rich(table))
