"""Short end-of-run tables, laid out like the seeds' own so numbers can be put side by side."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from contract.evals import EvalSummary
from contract.jobs import JobRecord
from contract.results import ProbeSummary, SweepSummary

__all__ = ["eval_table", "jobs_table", "probe_table", "sweep_tables"]


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def probe_table(rows: Sequence[tuple[str, ProbeSummary]]) -> Table:
    table = Table(title="One request (geometric mean of per-prompt medians)")
    for column in ("arm", "e2e tok/s", "decode", "TTFT ms", "at once", "x one", "repeat", "failed"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for arm, s in rows:
        table.add_row(
            arm,
            _num(s.e2e_tok_s),
            _num(s.decode_tok_s),
            _num(s.ttft_ms, 0),
            _num(s.at_once_aggregate_tok_s),
            _num(s.at_once_x_one, 2),
            f"{s.repeat_identical}/{len(s.prompts)}",
            str(s.requests_failed),
        )
    return table


def sweep_tables(rows: Sequence[tuple[str, SweepSummary]]) -> list[Table]:
    """One table per shape: aggregate output tok/s (median of repeats) per level and arm."""
    shapes: list[str] = []
    for _, summary in rows:
        shapes.extend(c.shape for c in summary.cells if c.shape not in shapes)
    tables = []
    for shape in shapes:
        table = Table(title=f"Aggregate output tok/s, {shape} (median of repeats)")
        table.add_column("requests", justify="right")
        for arm, _ in rows:
            table.add_column(arm, justify="right")
        levels = sorted({c.concurrency for _, s in rows for c in s.cells if c.shape == shape})
        for level in levels:
            cells = []
            for _, summary in rows:
                cell = next(
                    (c for c in summary.cells if c.shape == shape and c.concurrency == level),
                    None,
                )
                if cell is None:
                    cells.append("not run")
                elif cell.status == "ok":
                    cells.append(_num(cell.aggregate_output_tok_s_median))
                elif cell.status == "partial":
                    lost = sum(w.requests_failed for w in cell.repeats)
                    sent = lost + sum(w.requests_ok for w in cell.repeats)
                    median = _num(cell.aggregate_output_tok_s_median)
                    cells.append(f"{median} partial ({lost}/{sent} failed)")
                else:
                    cells.append(cell.status)
            table.add_row(str(level), *cells)
        counts = [s.counts for _, s in rows]
        table.caption = "; ".join(
            f"{arm}: {c['measured']} measured / {c.get('partial', 0)} partial / "
            f"{c['failed']} failed / {c['infeasible']} infeasible"
            for (arm, _), c in zip(rows, counts, strict=True)
        )
        if any(c.get("partial") for c in counts):
            table.caption += " (partial: some requests failed; not comparable, never ranked)"
        tables.append(table)
    return tables


def jobs_table(records: Sequence[JobRecord]) -> Table:
    table = Table(title="Jobs")
    for column in ("job", "status", "ready s", "first completion s", "J/token", "reason"):
        table.add_column(column)
    for r in records:
        joules = (r.telemetry or {}).get("joules_per_output_token")
        table.add_row(
            r.job_id,
            r.status,
            _num(r.health_s, 2),
            _num(r.first_completion_s, 2),
            _num(joules, 4) if isinstance(joules, float) else "-",
            r.reason or "",
        )
    return table


def eval_table(rows: Sequence[tuple[str, EvalSummary]]) -> Table:
    table = Table(title="Answer quality")
    for column in ("arm", "eval", "score", "answered", "truncated", "failed", "time s"):
        table.add_column(column, justify="left" if column in ("arm", "eval") else "right")
    for arm, s in rows:
        table.add_row(
            arm,
            f"{s.eval} ({s.prompt})",
            _num(s.score, 4),
            str(s.answered),
            str(s.truncated),
            str(s.failed),
            _num(s.wall_s),
        )
    return table
