"""`bench run [SPEC]`: a campaign on this machine, printed as the report's tables."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from agent.local import run_campaign_here
from report.console import print_tables, report_of, run_tables

__all__ = ["run_local"]


def run_local(spec: Path | None, out_root: Path, gsm8k_data: Path | None = None) -> int:
    outcomes = run_campaign_here(spec, out_root, gsm8k_data=gsm8k_data)
    console = Console()
    failed = 0
    for outcome in outcomes:
        print_tables(console, run_tables(report_of([outcome.shard_dir])))
        console.print(f"results: {outcome.shard_dir}", markup=False)
        console.print(f"report:  bench report {outcome.shard_dir}", markup=False)
        failed += len(outcome.failed)
    return 0 if failed == 0 else 1
