"""Latency against request rate: the rate-mode cells of every arm, keyed by (shape, level,
rate) as the agent keys them, as one row each, a table per shape and a plot per shape of
TTFT, TPOT and end-to-end latency percentiles (p50 solid, p99 dashed) against the rate.

Each percentile is the median over repeats of each window's own percentile, as in the load
sweep's tables. A cell that lost requests is labelled `partial, N failed` and drawn hollow;
an over-saturated one (its backlog kept growing) is marked `over-saturated` and its rate is
shaded on the plot: its latencies grow with the window, not with the rate. Results without
rate-mode cells give no rows, no table and no plot.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import cycle
from pathlib import Path

from contract import metrics
from contract.results import SweepSummary
from report.load import ArmResults
from report.rows import RateRow
from report.tables import Table, fmt

__all__ = ["rate_plots", "rate_rows", "rate_rows_of", "rate_tables"]

# The plot's three panels: (title, attribute prefix) of the rows' percentiles.
_PANELS = (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E latency", "e2el"))
_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
_MARKERS = ("o", "s", "^", "D", "v", "P", "*", "h")


def _median(values: Sequence[float | None]) -> float | None:
    return metrics.median(v for v in values if v is not None)


def rate_rows_of(label: str, summary: SweepSummary) -> list[RateRow]:
    """One row per rate-mode cell of one sweep, in shape then rate order."""
    rows = []
    for cell in summary.cells:
        if cell.mode != "rate" or cell.request_rate is None:
            continue
        windows = cell.repeats
        offered = [w.arrivals for w in windows if w.arrivals is not None]
        rows.append(
            RateRow(
                label=label,
                shape=cell.shape,
                max_concurrency=cell.concurrency,
                rate=cell.request_rate,
                status=cell.status,
                reason=cell.reason,
                offered_rate=_median([a.offered_rate for a in offered]),
                served_rate=_median([w.request_per_s for w in windows]),
                ttft_p50_ms=_median([w.ttft_ms.p50 for w in windows]),
                ttft_p99_ms=_median([w.ttft_ms.p99 for w in windows]),
                tpot_p50_ms=_median([w.tpot_ms.p50 for w in windows]),
                tpot_p99_ms=_median([w.tpot_ms.p99 for w in windows]),
                e2el_p50_ms=_median([w.latency_ms.p50 for w in windows]),
                e2el_p99_ms=_median([w.latency_ms.p99 for w in windows]),
                lag_p99_ms=_median([a.schedule_lag_ms.p99 for a in offered]),
                over_saturated=cell.over_saturated,
                requests_failed=sum(w.requests_failed for w in windows),
            )
        )
    order = {shape: i for i, shape in enumerate(dict.fromkeys(r.shape for r in rows))}
    return sorted(rows, key=lambda r: (order[r.shape], r.max_concurrency, r.rate))


def rate_rows(arms: Sequence[ArmResults]) -> list[RateRow]:
    return [row for arm in arms if arm.sweep for row in rate_rows_of(arm.label, arm.sweep)]


def _status(row: RateRow) -> str:
    text = f"partial, {row.requests_failed} failed" if row.status == "partial" else row.status
    return text + (", over-saturated" if row.over_saturated else "")


def rate_tables(rows: Sequence[RateRow]) -> list[Table]:
    """One table per shape: every arm at every rate, with what was offered and served."""
    tables = []
    for shape in dict.fromkeys(r.shape for r in rows):
        mine = [r for r in rows if r.shape == shape]
        capped = any(r.max_concurrency for r in mine)
        body = []
        for r in mine:
            figures = r.status in ("ok", "partial")
            line = (r.label,) + ((str(r.max_concurrency or "-"),) if capped else ())
            line += (fmt(r.rate, 2),)
            line += tuple(
                fmt(v, 2 if i < 2 else 1) if figures else "-"
                for i, v in enumerate(
                    (
                        r.offered_rate,
                        r.served_rate,
                        r.ttft_p50_ms,
                        r.ttft_p99_ms,
                        r.tpot_p50_ms,
                        r.tpot_p99_ms,
                        r.e2el_p50_ms,
                        r.e2el_p99_ms,
                    )
                )
            )
            line += (fmt(r.lag_p99_ms, 2) if figures else "-", _status(r))
            body.append(line)
        columns = ("arm",) + (("max conc.",) if capped else ()) + ("rate/s",)
        columns += ("offered/s", "served req/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms")
        columns += ("TPOT p99 ms", "E2EL p50 ms", "E2EL p99 ms", "sched. lag p99 ms", "status")
        tables.append(
            Table(
                key=f"rate-{shape}",
                title=f"Latency against request rate, {shape}",
                columns=columns,
                rows=body,
                caption="Open-loop arrivals at each rate (rate mode). Percentiles: the median "
                "over repeats of each window's own. `over-saturated`: requests due but not "
                "finished kept growing through the window, so its latencies grow with the "
                "window, not the rate; `partial, N failed`: it lost requests, not comparable. "
                "Schedule lag: how late the client sent against the arrival schedule.",
                align_left=2 if capped else 1,
            )
        )
    return tables


def rate_plots(rows: Sequence[RateRow], out: Path) -> list[tuple[str, str, Path, str]]:
    """(key, title, path, caption) of one PNG per shape with any figure."""
    from matplotlib.figure import Figure

    drawn = []
    labels = list(dict.fromkeys(r.label for r in rows))
    styles = dict(zip(labels, zip(cycle(_COLOURS), cycle(_MARKERS), strict=False), strict=False))
    for shape in dict.fromkeys(r.shape for r in rows):
        mine = [r for r in rows if r.shape == shape and r.status in ("ok", "partial")]
        if not mine:
            continue
        fig = Figure(figsize=(10.5, 3.8), dpi=130, layout="constrained")
        axes = fig.subplots(1, len(_PANELS), sharex=True)
        for ax, (title, prefix) in zip(axes, _PANELS, strict=True):
            for label in labels:
                series = sorted((r for r in mine if r.label == label), key=lambda r: r.rate)
                colour, marker = styles[label]
                for pct, dash in (("p50", "-"), ("p99", "--")):
                    points = [(r, getattr(r, f"{prefix}_{pct}_ms")) for r in series]
                    points = [(r, v) for r, v in points if v is not None]
                    if not points:
                        continue
                    ax.plot(
                        [r.rate for r, _ in points],
                        [v for _, v in points],
                        color=colour,
                        linestyle=dash,
                        linewidth=1.2,
                        label=f"{label} {pct}",
                    )
                    for r, v in points:
                        hollow = r.status == "partial"
                        ax.plot(
                            r.rate,
                            v,
                            marker=marker,
                            color=colour,
                            markerfacecolor="white" if hollow else colour,
                        )
            for r in mine:
                if r.over_saturated:
                    ax.axvspan(r.rate * 0.97, r.rate * 1.03, color="#D55E00", alpha=0.12, lw=0)
            ax.set_title(f"{title}, ms")
            ax.set_xlabel("request rate, req/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
        axes[0].legend(fontsize=7)
        path = out / f"rate-{shape}.png"
        fig.savefig(path, format="png", dpi=130, facecolor="white")
        drawn.append(
            (
                f"rate-{shape}",
                f"Latency against request rate, {shape}",
                path,
                "p50 solid, p99 dashed, per arm; hollow marker: a partial cell (lost "
                "requests); shaded: an over-saturated rate.",
            )
        )
    return drawn
