"""Soak: `bench run` (the embedded default campaign) N times in a row; how many jobs fail, why.

Each run is a real `bench` subprocess into a fresh results root, so nothing carries over but
the work dir (llama.cpp's build, the generated models), exactly as a user repeating the
command would see. Per run: the exit status, jobs ok / failed (from each job's `job.json`),
the failure reasons, partial or failed sweep cells and the wall time. Target: 0 failed.

Run: `python -m benchmarks.soak_bench_run --repeats 20 [--out DIR] [--max-minutes M]`;
prints a table (also as JSON lines to `<out>/soak.jsonl`). `--max-minutes` stops before a
run that would start past the bound, so the table says how many were run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from contract.jobs import JOB_FILE, JobRecord
from contract.results import SUMMARY_FILE, SweepSummary


def _jobs(root: Path) -> list[JobRecord]:
    return [
        JobRecord.model_validate_json(path.read_text())
        for path in sorted(root.glob(f"*/*/jobs/*/{JOB_FILE}"))
    ]


def _lossy_cells(root: Path) -> int:
    count = 0
    for path in root.glob(f"*/*/jobs/*-sweep/{SUMMARY_FILE}"):
        summary = SweepSummary.model_validate_json(path.read_text())
        count += sum(1 for c in summary.cells if c.status in ("partial", "failed"))
    return count


def one_run(index: int, out: Path) -> dict[str, object]:
    root = out / f"run-{index:02d}"
    started = time.monotonic()
    result = subprocess.run(
        [str(Path(sys.executable).with_name("bench")), "run", "--out", str(root)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    jobs = _jobs(root)
    failed = [j for j in jobs if j.status == "failed"]
    reasons = sorted({f"{j.job_id}: {(j.reason or '?').splitlines()[0][:120]}" for j in failed})
    if result.returncode != 0 and not jobs:
        reasons = [result.stderr.strip().splitlines()[-1][:160] if result.stderr else "?"]
    return {
        "run": index,
        "exit": result.returncode,
        "jobs_ok": len(jobs) - len(failed),
        "jobs_failed": len(failed),
        "lossy_cells": _lossy_cells(root),
        "wall_s": round(time.monotonic() - started, 1),
        "reasons": reasons,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, help="results roots go here (default: a temp dir)")
    parser.add_argument("--max-minutes", type=float, help="start no run after this many minutes")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="soak-"))
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    rows = []
    print(f"{'run':>3}  {'exit':>4}  {'jobs ok':>7}  {'failed':>6}  {'lossy cells':>11}  "
          f"{'wall s':>7}  reasons", flush=True)  # fmt: skip
    for index in range(1, args.repeats + 1):
        if args.max_minutes and time.monotonic() - began > args.max_minutes * 60:
            break
        row = one_run(index, out)
        rows.append(row)
        with (out / "soak.jsonl").open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        reasons = "; ".join(row["reasons"]) or "-"  # type: ignore[arg-type]
        print(
            f"{row['run']:>3}  {row['exit']:>4}  {row['jobs_ok']:>7}  {row['jobs_failed']:>6}  "
            f"{row['lossy_cells']:>11}  {row['wall_s']:>7}  {reasons}",
            flush=True,
        )
    failed = sum(int(r["jobs_failed"]) for r in rows)  # type: ignore[call-overload]
    print(f"{len(rows)} run(s) of {args.repeats} asked; {failed} job(s) failed; results: {out}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
