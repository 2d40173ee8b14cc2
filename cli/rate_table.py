"""The end-of-run table of a rate-mode sweep: one row per shape and request rate."""

from __future__ import annotations

from rich.table import Table

from contract import metrics
from contract.results import CellResult, SweepSummary

__all__ = ["rate_table"]


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _tok_s(cell: CellResult) -> str:
    """The cell's figure; a partial cell's with its loss before it, as the report shows it."""
    figure = _num(cell.aggregate_output_tok_s_median)
    if cell.status != "partial":
        return figure
    return f"partial, {sum(w.requests_failed for w in cell.repeats)} failed: {figure}"


def rate_table(summary: SweepSummary) -> Table:
    """Offered vs served, latency and the scheduler's own lag, medians over repeats."""
    table = Table(title="Request-rate sweep (median of repeats)")
    columns = ("shape", "rate/s", "offered/s", "served req/s", "out tok/s", "TTFT p50 ms",
               "lag p99 ms", "status", "over-saturated")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column in ("shape", "status") else "right")
    for cell in summary.cells:
        offered = [w.arrivals for w in cell.repeats if w.arrivals is not None]
        lag_p99 = metrics.median(a.schedule_lag_ms.p99 for a in offered if a.schedule_lag_ms.p99)
        table.add_row(
            cell.shape,
            _num(cell.request_rate, 2),
            _num(metrics.median(a.offered_rate for a in offered if a.offered_rate), 2),
            _num(metrics.median(w.request_per_s for w in cell.repeats if w.request_per_s), 2),
            _tok_s(cell),
            _num(cell.ttft_ms_p50_median),
            _num(lag_p99, 2),
            cell.status + (" (prefix cache!)" if cell.prefix_cache_suspect else ""),
            "yes" if cell.over_saturated else "no",
        )
    return table
