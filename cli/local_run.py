"""`bench run [SPEC]`: a campaign on this machine, printed as the seeds' tables."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from agent.local import run_campaign_here
from cli.tables import eval_table, jobs_table, probe_table, sweep_tables
from contract.evals import EvalSummary
from contract.results import SUMMARY_FILE, ProbeSummary, SweepSummary

__all__ = ["run_local"]


def run_local(spec: Path | None, out_root: Path, gsm8k_data: Path | None = None) -> int:
    outcomes = run_campaign_here(spec, out_root, gsm8k_data=gsm8k_data)
    console = Console()
    failed = 0
    for outcome in outcomes:
        probes: list[tuple[str, ProbeSummary]] = []
        sweeps: list[tuple[str, SweepSummary]] = []
        evals: list[tuple[str, EvalSummary]] = []
        for record in outcome.records:
            path = outcome.shard_dir / "jobs" / record.job_id / SUMMARY_FILE
            if record.status != "ok" or not path.exists():
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
