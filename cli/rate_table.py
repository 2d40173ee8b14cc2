"""The end-of-run tables of a rate-mode sweep: the report's latency-against-rate view."""

from __future__ import annotations

from rich.console import Group

from contract.results import SweepSummary
from report.console import to_rich
from report.rate import rate_rows_of, rate_tables

__all__ = ["rate_table"]


def rate_table(summary: SweepSummary) -> Group:
    """Offered vs served, TTFT/TPOT/E2EL percentiles and the scheduler's lag, per shape."""
    return Group(*(to_rich(t) for t in rate_tables(rate_rows_of(summary.model, summary))))
