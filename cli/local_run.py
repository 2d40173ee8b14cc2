"""`bench run [SPEC]`: a campaign on this machine, printed as the seeds' tables.

A shard folder that holds an earlier run is refused unless `--resume` (done jobs are
skipped, the manifest merges the runs) or `--overwrite` (the old folder moved aside).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from agent.campaigns import LOCAL_DEFAULT
from agent.local import run_campaign_here
from cli.outdir import OutMode, prepare_out
from cli.tables import eval_table, jobs_table, probe_table, sweep_tables
from contract.evals import EvalSummary
from contract.results import SUMMARY_FILE, ProbeSummary, SweepSummary
from contract.spec import load_campaign

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
        probes: list[tuple[str, ProbeSummary]] = []
        sweeps: list[tuple[str, SweepSummary]] = []
        evals: list[tuple[str, EvalSummary]] = []
        for record in outcome.records:
            path = outcome.shard_dir / "jobs" / record.job_id / SUMMARY_FILE
            if not path.exists():  # a failed job's summary is shown too, with its statuses
                continue
            text = path.read_text()
            if record.item == "probe":
                probes.append((record.arm, ProbeSummary.model_validate_json(text)))
            elif record.item == "sweep":
                sweeps.append((record.arm, SweepSummary.model_validate_json(text)))
            else:
                evals.append((record.arm, EvalSummary.model_validate_json(text)))
        console.print(jobs_table(outcome.records))
        if probes:
            console.print(probe_table(probes))
        for table in sweep_tables(sweeps):
            console.print(table)
        if evals:
            console.print(eval_table(evals))
        console.print(f"results: {outcome.shard_dir}")
        failed += len(outcome.failed)
    return 0 if failed == 0 else 1
