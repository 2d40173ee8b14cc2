"""Rows that compare GPUs (results folders, or a campaign's instance types): each arm against
its own run on the first GPU, and which arm to run where.

A "site" is what an arm ran on as the per-GPU tables name it (`ArmResults.where`: the folder
label, or the instance type). The cross-GPU rows follow seed 001, which tabled each engine
on the T4 against its own L4 run: the one-request figure and the top-load figure as ratios
(marked "not a difference" within the run-to-run spread), and the accuracy evals paired
question by question (`contract.paired`), so "level or not" holds across folders.
"""

from __future__ import annotations

from collections.abc import Sequence

from contract.evals import DataError
from contract.paired import compare_runs, load_run
from contract.suite import EVAL_ITEMS
from report.arms import engine_name
from report.load import ArmResults
from report.rows import (
    CostPoint,
    CrossRow,
    Pick,
    ProbeRow,
    SiteBest,
    SweepCell,
    SweepGrid,
    UseCase,
    beyond_spread,
)

__all__ = ["cross_rows", "site_rows", "sites", "use_cases"]


def sites(arms: Sequence[ArmResults]) -> list[str]:
    return list(dict.fromkeys(a.where for a in arms))


def _top_cell(grid: SweepGrid, label: str) -> SweepCell | None:
    cells = [grid.cells[(label, n)] for n in grid.levels if (label, n) in grid.cells]
    return cells[-1] if cells else None


def _eval_text(arm: ArmResults, ref: ArmResults, item: str) -> str:
    summary = arm.evals.get(item)
    if summary is None:
        return arm.status(item) if arm.status(item) != "ok" else "no summary"
    score = f"{summary.score:.4f}" if summary.score is not None else "-"
    if arm is ref:
        return f"{score} (reference)"
    if item not in ref.job_dirs or item not in arm.job_dirs:
        return f"{score} (reference has no {item} run)"
    try:
        c = compare_runs(load_run(ref.job_dirs[item], ref.label), load_run(arm.job_dirs[item]))
    except DataError as exc:
        return f"{score} ({exc})"
    return f"{score} ({c.verdict}, {100 * (c.difference or 0.0):+.1f} pts)"


def cross_rows(
    arms: Sequence[ArmResults], probe: Sequence[ProbeRow], grids: Sequence[SweepGrid]
) -> list[CrossRow]:
    """Every arm that ran on two or more sites, against its run on the first."""
    order = sites(arms)
    if len(order) < 2:
        return []
    by_label = {r.label: r for r in probe}
    grid = grids[0] if grids else None
    names: dict[str, list[ArmResults]] = {}
    for arm in arms:
        names.setdefault(arm.arm, []).append(arm)
    rows = []
    for name, members in names.items():
        if len({a.where for a in members}) < 2:
            continue
        members.sort(key=lambda a: order.index(a.where))
        ref = members[0]
        ref_probe = by_label.get(ref.label)
        ref_cell = _top_cell(grid, ref.label) if grid else None
        for arm in members:
            p = by_label.get(arm.label)
            one = p.e2e_tok_s if p else None
            ref_one = ref_probe.e2e_tok_s if ref_probe else None
            one_ratio = one / ref_one if one and ref_one else None
            cell = _top_cell(grid, arm.label) if grid else None
            tok_s = cell.tok_s if cell and cell.ranked else None
            ref_tok_s = ref_cell.tok_s if ref_cell and ref_cell.ranked else None
            load_ratio = tok_s / ref_tok_s if tok_s and ref_tok_s else None
            rows.append(
                CrossRow(
                    arm=name,
                    engine=engine_name(arm),
                    site=arm.where,
                    reference=ref.where,
                    one_tok_s=one,
                    one_ratio=one_ratio,
                    one_differs=beyond_spread(
                        one_ratio,
                        p.relative_spread if p else None,
                        ref_probe.relative_spread if ref_probe else None,
                    ),
                    load_shape=grid.shape if grid else None,
                    load_level=cell.concurrency if cell else None,
                    load_tok_s=tok_s,
                    load_status=cell.status if cell else "not run",
                    load_ratio=load_ratio,
                    load_differs=beyond_spread(
                        load_ratio,
                        cell.relative_spread if cell else None,
                        ref_cell.relative_spread if ref_cell else None,
                    ),
                    evals={
                        item: _eval_text(arm, ref, item)
                        for item in EVAL_ITEMS
                        if any(item in a.evals or item in a.jobs for a in members)
                    },
                )
            )
    return rows


def _usd(points: Sequence[CostPoint], label: str, shape: str, level: int) -> float | None:
    return next(
        (
            p.on_demand_usd_per_m
            for p in points
            if (p.label, p.shape, p.concurrency) == (label, shape, level)
        ),
        None,
    )


def site_rows(
    arms: Sequence[ArmResults],
    probe: Sequence[ProbeRow],
    grids: Sequence[SweepGrid],
    points: Sequence[CostPoint],
) -> list[SiteBest]:
    """Per site and shape: the fastest arm at one request, at the highest level, and the
    highest-throughput cell meeting the SLO. Complete (ranked) figures only."""
    where = {a.label: a.where for a in arms}
    rows = []
    for site in sites(arms):
        ones = [r for r in probe if where.get(r.label) == site and r.e2e_tok_s]
        one = max(ones, key=lambda r: r.e2e_tok_s or 0.0, default=None)
        one_pick = Pick(one.label, one.e2e_tok_s or 0.0) if one else None
        shown: list[SweepGrid | None] = list(grids) or [None]
        for grid in shown:
            top = slo = None
            if grid is not None:
                mine = [c for c in grid.cells.values() if where.get(c.label) == site and c.ranked]
                level = max((c.concurrency for c in mine), default=None)
                top = max(
                    (c for c in mine if c.concurrency == level),
                    key=lambda c: c.tok_s or 0.0,
                    default=None,
                )
                slo = max(
                    (c for c in mine if c.meets_slo), key=lambda c: c.tok_s or 0.0, default=None
                )
            rows.append(
                SiteBest(
                    site=site,
                    shape=grid.shape if grid else None,
                    one_request=one_pick,
                    top_load=_pick(top, points),
                    under_slo=_pick(slo, points),
                )
            )
    return rows


def _pick(cell: SweepCell | None, points: Sequence[CostPoint]) -> Pick | None:
    if cell is None or cell.tok_s is None:
        return None
    usd = _usd(points, cell.label, cell.shape, cell.concurrency)
    return Pick(cell.label, cell.tok_s, usd, cell.concurrency, cell.shape)


def use_cases(rows: Sequence[SiteBest]) -> list[UseCase]:
    """The overall pick per use case: the fastest single reply; the lowest $/M tokens at
    full load and under the SLO (the highest tok/s where no price applies)."""
    out = []
    ones = [(r.one_request, r.site) for r in rows if r.one_request]
    best_one = max(ones, key=lambda p: p[0].tok_s, default=None)
    out.append(
        UseCase(
            "one user: fastest reply",
            best_one[0] if best_one else None,
            best_one[1] if best_one else None,
            "highest one-request e2e tok/s",
        )
    )
    uses = (("batch: most tokens per dollar", "top_load"), ("serving under the SLO", "under_slo"))
    for use, attr in uses:
        picks = [(getattr(r, attr), r.site) for r in rows if getattr(r, attr) is not None]
        priced = [p for p in picks if p[0].usd_per_m is not None]
        best: tuple[Pick, str] | None
        if priced:
            best = min(priced, key=lambda p: p[0].usd_per_m or 0.0)
            why = "lowest $/M output tokens on demand"
        else:
            best = max(picks, key=lambda p: p[0].tok_s, default=None)
            why = "highest aggregate tok/s (no price applies)"
        out.append(UseCase(use, best[0] if best else None, best[1] if best else None, why))
    return out
