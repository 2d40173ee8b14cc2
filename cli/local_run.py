"""`bench run [SPEC]`: a campaign on this machine, printed as the report's tables.

A shard folder that holds an earlier run is refused unless `--resume` (done jobs are
skipped, the manifest merges the runs) or `--overwrite` (the old folder moved aside).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from agent.campaigns import LOCAL_DEFAULT
from agent.local import run_campaign_here
from cli.outdir import OutMode, prepare_out
from contract.spec import load_campaign
from report.console import print_tables, report_of, run_tables

__all__ = ["run_local"]


def run_local(
    spec: Path | None, out_root: Path, gsm8k_data: Path | None = None, mode: OutMode = "new"
) -> int:
    console = Console()
    campaign = load_campaign(spec or LOCAL_DEFAULT)
    for shard in campaign.shards:
        folder = out_root / campaign.name / shard.name
        if mode == "resume" and not folder.exists():
            continue  # a shard the earlier run never reached starts here
        aside = prepare_out(folder, mode, flag="--out")
        if aside:
            console.print(f"earlier results of shard {shard.name} moved to {aside}")
    outcomes = run_campaign_here(spec, out_root, gsm8k_data=gsm8k_data)
    failed = 0
    for outcome in outcomes:
        print_tables(console, run_tables(report_of([outcome.shard_dir])))
        console.print(f"results: {outcome.shard_dir}", markup=False)
        console.print(f"report:  bench report {outcome.shard_dir}", markup=False)
        failed += len(outcome.failed)
    return 0 if failed == 0 else 1
