"""Accuracy rows (paired with the baseline arm, question by question) and eval times."""

from __future__ import annotations

from collections.abc import Sequence

from contract.evals import DataError, EvalSummary
from contract.paired import compare_runs, load_run
from report.arms import engine_groups, is_drafter
from report.load import ArmResults
from report.rows import AccuracyRow, EvalTimeRow

__all__ = ["accuracy_rows", "eval_time_rows"]


def accuracy_rows(
    arms: Sequence[ArmResults], baseline: ArmResults | None, items: Sequence[str]
) -> dict[str, list[AccuracyRow]]:
    out: dict[str, list[AccuracyRow]] = {}
    for item in items:
        base_run = None
        base_note = None
        if baseline is not None and item in baseline.job_dirs:
            try:
                base_run = load_run(baseline.job_dirs[item], baseline.label)
            except DataError as exc:
                base_note = f"baseline {baseline.label}: {exc}"
        elif baseline is not None:
            base_note = f"baseline {baseline.label} has no {item} run"
        rows = []
        for arm in arms:
            summary: EvalSummary | None = arm.evals.get(item)
            if summary is None:
                status = arm.status(item)
                rows.append(
                    AccuracyRow(
                        item,
                        arm.label,
                        "failed" if status == "ok" else status,
                        arm.reason(item) or ("no summary.json" if status == "ok" else None),
                    )
                )
                continue
            comparison, note = None, base_note
            if base_run is not None and arm is not baseline:
                try:
                    comparison = compare_runs(base_run, load_run(arm.job_dirs[item], arm.label))
                except DataError as exc:
                    note = str(exc)
            rows.append(
                AccuracyRow(
                    eval=item,
                    label=arm.label,
                    status=arm.status(item),
                    reason=arm.reason(item),
                    score=summary.score,
                    correct=summary.correct,
                    answered=summary.answered,
                    questions=summary.questions,
                    complete=summary.complete,
                    truncated=summary.truncated,
                    failed=summary.failed,
                    wall_s=summary.wall_s,
                    comparison=comparison,
                    comparison_note=None if arm is baseline else note,
                )
            )
        out[item] = rows
    return out


def eval_time_rows(arms: Sequence[ArmResults], item: str = "gsm8k") -> list[EvalTimeRow]:
    """Time to finish an eval with and without a drafter, per engine with a drafter arm."""
    group = engine_groups(arms)
    engines: dict[str, list[ArmResults]] = {}
    for arm in arms:
        summary = arm.evals.get(item)
        if summary is not None and summary.complete:
            engines.setdefault(group(arm), []).append(arm)
    rows = []
    for engine, members in engines.items():
        plain = [a for a in members if not is_drafter(a)]
        drafted = [a for a in members if is_drafter(a)]
        plain_arm = min(plain, key=lambda a: len(a.arm), default=None)
        fastest = min(drafted, key=lambda a: a.evals[item].wall_s, default=None)
        plain_s = plain_arm.evals[item].wall_s if plain_arm else None
        drafted_s = fastest.evals[item].wall_s if fastest else None
        rows.append(
            EvalTimeRow(
                engine=engine,
                plain=plain_arm.label if plain_arm else None,
                plain_s=plain_s,
                drafted=fastest.label if fastest else None,
                drafted_s=drafted_s,
                speedup=plain_s / drafted_s if plain_s and drafted_s else None,
            )
        )
    return rows
