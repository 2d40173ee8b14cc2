"""`bench run`: the embedded default, printed as the seeds' tables."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from agent.local_default import run_local_default
from cli.tables import probe_table, sweep_tables

__all__ = ["run_local"]


def run_local(out_root: Path) -> int:
    run = run_local_default(out_root)
    console = Console()
    console.print(
        f"{run.engine} {run.build_id}: healthy after {run.health_s:.1f} s, "
        f"first completion {run.first_completion_s:.2f} s later"
    )
    console.print(probe_table([(run.engine, run.probe)]))
    for table in sweep_tables([(run.engine, run.sweep)]):
        console.print(table)
    console.print(f"results: {run.campaign_dir}")
    failed = run.probe.requests_failed + run.sweep.counts["failed"]
    return 0 if failed == 0 else 1
