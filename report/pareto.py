"""Pareto views: what a user gets against what the machine delivers, and what it costs.

Two plots per shape, from complete (ranked) sweep cells only:
- per-user decode tok/s (p50) against aggregate output tok/s, each arm a curve over its
  levels (the level written by each point): up and to the right is better on both;
- $ per million output tokens (on demand) against per-user decode tok/s, every arm's
  cells: down and to the right is better on both.
The frontier (cells no other cell beats on both axes) is drawn as a step line and named in
the caption, so the figure can be read without the colours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from report.rows import Report

__all__ = ["ParetoPoint", "frontier", "pareto_plots", "pareto_points"]

_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
_MARKERS = ("o", "s", "^", "D", "v", "P", "*", "h")
_DPI = 130


@dataclass(frozen=True)
class ParetoPoint:
    label: str
    level: int
    aggregate_tok_s: float
    user_tok_s: float
    usd_per_m: float | None


def pareto_points(report: Report, shape: str) -> list[ParetoPoint]:
    grid = next((g for g in report.sweeps if g.shape == shape), None)
    if grid is None:
        return []
    usd = {
        (p.label, p.concurrency): p.on_demand_usd_per_m
        for p in report.cost_points
        if p.shape == shape
    }
    points = []
    for (label, level), cell in grid.cells.items():
        if cell.ranked and cell.tok_s and cell.user_decode_p50_tok_s:
            points.append(
                ParetoPoint(
                    label, level, cell.tok_s, cell.user_decode_p50_tok_s, usd.get((label, level))
                )
            )
    return points


def frontier(points: Sequence[ParetoPoint], *, by_cost: bool = False) -> list[ParetoPoint]:
    """Points no other point beats on both axes: more aggregate tok/s (or lower $/M tokens
    with `by_cost`) and more per-user tok/s. Sorted by per-user tok/s, fastest first."""
    usable = [p for p in points if not by_cost or p.usd_per_m is not None]
    ordered = sorted(
        usable, key=lambda p: (-p.user_tok_s, p.usd_per_m if by_cost else -p.aggregate_tok_s)
    )
    out: list[ParetoPoint] = []
    for p in ordered:
        if by_cost:
            if not out or (p.usd_per_m or 0.0) < (out[-1].usd_per_m or 0.0):
                out.append(p)
        elif not out or p.aggregate_tok_s > out[-1].aggregate_tok_s:
            out.append(p)
    return out


def _names(points: Sequence[ParetoPoint]) -> str:
    return ", ".join(f"{p.label} at {p.level}" for p in points)


def _figure() -> Figure:
    return Figure(figsize=(7.5, 4.6), dpi=_DPI, layout="constrained")


def pareto_plots(report: Report, out: Path) -> list[tuple[str, str, Path, str]]:
    """(key, title, path, caption) of each plot drawn; `report.plots` wraps them."""
    drawn = []
    styles = dict(
        zip(report.arms, zip(cycle(_COLOURS), cycle(_MARKERS), strict=False), strict=False)
    )
    for shape in report.shapes:
        points = pareto_points(report, shape)
        if len(points) < 2:
            continue
        fig = _figure()
        ax = fig.add_subplot()
        for label in dict.fromkeys(p.label for p in points):
            mine = sorted((p for p in points if p.label == label), key=lambda p: p.level)
            colour, marker = styles.get(label, ("#000000", "o"))
            ax.plot(
                [p.aggregate_tok_s for p in mine],
                [p.user_tok_s for p in mine],
                color=colour,
                marker=marker,
                linewidth=1.4,
                label=label,
            )
            for p in mine:
                ax.annotate(
                    str(p.level),
                    (p.aggregate_tok_s, p.user_tok_s),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        best = frontier(points)
        # The edge of what the frontier dominates: each cell's speed holds up to its x.
        edge = sorted(best, key=lambda p: p.aggregate_tok_s)
        ax.step(
            [p.aggregate_tok_s for p in edge],
            [p.user_tok_s for p in edge],
            where="pre",
            color="#777777",
            linestyle=":",
            linewidth=2.2,
            label="frontier",
        )
        ax.set_xlabel("aggregate output tok/s (all requests)")
        ax.set_ylabel("per-user decode tok/s (p50)")
        ax.set_title(f"What each user gets vs what the machine delivers, {shape}")
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.legend(fontsize=8, loc="best")
        path = out / f"pareto-user-{shape}.png"
        fig.savefig(path, format="png", dpi=_DPI, facecolor="white")
        drawn.append(
            (
                f"pareto-user-{shape}",
                f"Per-user vs aggregate tok/s, {shape}",
                path,
                "Each arm's complete cells joined over its levels (the number by each point: "
                f"requests at once). Frontier (dotted): {_names(best)}.",
            )
        )
        priced = [p for p in points if p.usd_per_m is not None]
        if len(priced) < 2:
            continue
        fig = _figure()
        ax = fig.add_subplot()
        for label in dict.fromkeys(p.label for p in priced):
            mine = sorted((p for p in priced if p.label == label), key=lambda p: p.level)
            colour, marker = styles.get(label, ("#000000", "o"))
            ax.scatter(
                [p.user_tok_s for p in mine],
                [p.usd_per_m or 0.0 for p in mine],
                color=colour,
                marker=marker,
                label=label,
                s=36,
            )
        cheap = frontier(priced, by_cost=True)
        edge = sorted(cheap, key=lambda p: p.user_tok_s)
        ax.step(
            [p.user_tok_s for p in edge],
            [p.usd_per_m or 0.0 for p in edge],
            where="pre",
            color="#777777",
            linestyle=":",
            linewidth=2.2,
            label="frontier",
        )
        ax.set_yscale("log")
        ax.set_xlabel("per-user decode tok/s (p50)")
        ax.set_ylabel("$ per million output tokens, on demand (log)")
        ax.set_title(f"Cost vs per-user speed, {shape}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        path = out / f"pareto-cost-{shape}.png"
        fig.savefig(path, format="png", dpi=_DPI, facecolor="white")
        drawn.append(
            (
                f"pareto-cost-{shape}",
                f"$/M tokens vs per-user tok/s, {shape}",
                path,
                "Every complete cell at its instance's on-demand price. Frontier (dotted): the "
                f"cheapest cell for each per-user speed: {_names(cheap)}.",
            )
        )
    return drawn
