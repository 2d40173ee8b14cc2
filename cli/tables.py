"""Short end-of-run tables, laid out like the seeds' own so numbers can be put side by side."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from contract.results import ProbeSummary, SweepSummary

__all__ = ["probe_table", "sweep_tables"]


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
                else:
                    cells.append(cell.status)
            table.add_row(str(level), *cells)
        counts = [s.counts for _, s in rows]
        table.caption = "; ".join(
            f"{arm}: {c['measured']} measured / {c['failed']} failed / {c['infeasible']} infeasible"
            for (arm, _), c in zip(rows, counts, strict=True)
        )
        tables.append(table)
    return tables
