"""Tables of what each user sees under load, and the SLO headline.

Per arm and level: per-user decode speed (p50, and the p90 user's), TTFT p50/p99, TPOT and
ITL p99, and goodput; then per engine the highest level that meets the SLO, with its
aggregate tok/s, $/M tokens and J/token. Formatting only: the figures are `report.sweep`'s
and `report.slo`'s.
"""

from __future__ import annotations

from report.rows import Report, SweepCell
from report.tables import SLO_MISS, Table, fmt

__all__ = ["per_user_tables", "slo_table", "wait_table"]


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return fmt(value, 1 if value < 10 else 0)


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.2f}" if value >= 0.1 else f"${value:.3g}"


def _verdict(cell: SweepCell) -> str:
    if cell.meets_slo is None:
        return "-"
    return "meets" if cell.meets_slo else f"misses {SLO_MISS}"


def per_user_tables(report: Report) -> list[Table]:
    tables = []
    cells = [c for g in report.sweeps for c in g.cells.values()]
    goodput = any(c.goodput_request_per_s is not None for c in cells)
    for grid in report.sweeps:
        rows: list[tuple[str, ...]] = []
        muted: set[tuple[int, int]] = set()
        for label in grid.arms:
            for level in grid.levels:
                cell = grid.cells[(label, level)]
                if cell.tok_s is None:
                    continue
                figure = fmt(cell.tok_s)
                if cell.status == "partial":
                    figure = f"partial, {cell.requests_failed} failed: {figure}"
                row = (
                    label,
                    str(level),
                    figure,
                    fmt(cell.user_decode_p50_tok_s),
                    fmt(cell.user_decode_p90_tok_s),
                    _ms(cell.ttft_p50_ms),
                    _ms(cell.ttft_p99_ms),
                    _ms(cell.tpot_p99_ms),
                    _ms(cell.itl_p99_ms),
                    *((fmt(cell.goodput_request_per_s, 2),) if goodput else ()),
                    _verdict(cell),
                )
                if cell.meets_slo is False:
                    muted |= {(len(rows), j) for j in range(2, len(row))}
                rows.append(row)
        if not rows:
            continue
        tables.append(
            Table(
                key=f"user-{grid.shape}",
                title=f"What each user sees, {grid.shape}",
                columns=(
                    "arm",
                    "requests",
                    "aggregate tok/s",
                    "user decode p50",
                    "user decode p90",
                    "TTFT p50 ms",
                    "TTFT p99 ms",
                    "TPOT p99 ms",
                    "ITL p99 ms",
                    *(("goodput req/s",) if goodput else ()),
                    "SLO",
                ),
                rows=rows,
                caption=(
                    "Per cell, the median over repeats of each window's percentile. User "
                    "decode = 1000 / TPOT in tok/s: p50 from TPOT p50, p90 the speed 90% of "
                    "requests got at least (from TPOT p90). "
                    + (
                        "Goodput: requests per second meeting the run's own SLO, as measured. "
                        if goodput
                        else ""
                    )
                    + f"SLO: {report.slo.describe()}"
                    + (
                        f", judged on the p99s; {SLO_MISS} and greyed: missed."
                        if report.slo.given
                        else " (set slo_ttft_ms / slo_tpot_ms / slo_e2el_ms in the spec's "
                        "[suite.sweep] or pass bench report --slo-ttft-ms ...)."
                    )
                ),
                align_left=2,
                muted=frozenset(muted),
            )
        )
    return tables


def slo_table(report: Report) -> Table | None:
    if not report.slo.given or not report.slo_rows:
        return None
    rows = []
    for r in report.slo_rows:
        if r.concurrency is None:
            rows.append(
                (r.engine, r.shape, f"no level met it ({r.levels_tried} measured)", *["-"] * 6)
            )
            continue
        rows.append(
            (
                r.engine,
                r.shape,
                str(r.concurrency),
                r.label or "-",
                fmt(r.tok_s),
                fmt(r.user_decode_p50_tok_s),
                _ms(r.ttft_p99_ms),
                _usd(r.on_demand_usd_per_m),
                fmt(r.joules_per_token, 3),
            )
        )
    return Table(
        key="slo",
        title=f"Under the SLO ({report.slo.describe()}): each engine's highest level meeting it",
        columns=(
            "engine",
            "shape",
            "requests",
            "arm",
            "aggregate tok/s",
            "user decode p50",
            "TTFT p99 ms",
            "$/M tokens on-demand",
            "J/token",
        ),
        rows=rows,
        caption=(
            "The highest concurrency level at which one of the engine's arms meets every "
            "objective at its p99 (complete cells only; partial ones are never ranked), "
            "with that cell's figures; '-' where no price or energy reading applies."
        ),
        align_left=2,
    )


def wait_table(report: Report) -> Table | None:
    if not report.waits:
        return None
    return Table(
        key="server-waiting",
        title="Server view: where requests start waiting",
        columns=("arm", "shape", "first level with a request waiting", "peak waiting", "peak KV %"),
        rows=[
            (
                w.label,
                w.shape,
                str(w.first_waiting_level) if w.first_waiting_level else "none waited",
                fmt(w.peak_waiting, 0),
                fmt(w.peak_kv_pct, 1),
            )
            for w in report.waits
        ],
        caption=(
            "From the engine's own metrics polled during the sweep (requests waiting in its "
            "queue, KV-cache use), over each cell's measured windows: the lowest level at "
            "which a request waited, and the peaks over the whole sweep of that shape."
        ),
        align_left=2,
    )
