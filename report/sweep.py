"""The load sweep's rows: every arm at every level of every shape, and the best per level."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from contract import metrics
from contract.results import SweepSummary
from report.arms import drafter_label, engine_groups
from report.load import ArmResults, CampaignResults
from report.rows import BestCell, BestRow, Slo, Spread, SweepCell, SweepGrid, beyond_spread

__all__ = ["best_rows", "sweep_grids"]


def _median_of(values: Iterable[float | None]) -> float | None:
    return metrics.median(v for v in values if v is not None)


def _per_second(ms: float | None) -> float | None:
    return 1000.0 / ms if ms else None


def _sweep_cell(
    arm: ArmResults, summary: SweepSummary, shape: str, level: int, slo: Slo
) -> SweepCell:
    cell = next(
        (
            c
            for c in summary.cells
            if c.shape == shape and c.concurrency == level and c.mode != "rate"
        ),
        None,
    )
    if cell is None:
        return SweepCell(arm.label, shape, level, "not run", "the sweep did not reach this cell")
    if cell.status not in ("ok", "partial") or not cell.repeats:
        return SweepCell(arm.label, shape, level, cell.status, cell.reason)
    windows = cell.repeats
    values = [w.aggregate_output_tok_s for w in windows if w.aggregate_output_tok_s]
    tok_s = cell.aggregate_output_tok_s_median
    if tok_s is None and values:
        tok_s = metrics.median(values)
    figures = SweepCell(
        label=arm.label,
        shape=shape,
        concurrency=level,
        status=cell.status,
        reason=cell.reason,
        tok_s=tok_s,
        spread=Spread(min(values), max(values), len(values)) if values else None,
        ttft_p50_ms=cell.ttft_ms_p50_median or _median_of(w.ttft_ms.p50 for w in windows),
        ttft_p99_ms=_median_of(w.ttft_ms.p99 for w in windows),
        tpot_p99_ms=_median_of(w.tpot_ms.p99 for w in windows),
        itl_p99_ms=_median_of(w.itl_ms.p99 for w in windows),
        latency_p99_ms=_median_of(w.latency_ms.p99 for w in windows),
        user_decode_p50_tok_s=_median_of(_per_second(w.tpot_ms.p50) for w in windows),
        user_decode_p90_tok_s=_median_of(_per_second(w.tpot_ms.p90) for w in windows),
        goodput_request_per_s=_median_of(w.goodput_request_per_s for w in windows),
        requests_failed=sum(w.requests_failed for w in windows),
    )
    return replace(figures, meets_slo=slo.judge(figures))


def sweep_grids(arms: Sequence[ArmResults], campaign: CampaignResults, slo: Slo) -> list[SweepGrid]:
    spec_sweep = campaign.shards[0].manifest.campaign.suite.sweep
    shapes: list[str] = [s.name for s in spec_sweep.shapes] if spec_sweep else []
    # Rate-mode cells are keyed by rate, not level: they have their own view (report.rate).
    levels: list[int] = list(spec_sweep.levels) if spec_sweep and spec_sweep.mode != "rate" else []
    for arm in arms:
        if arm.sweep is None:
            continue
        by_level = [c for c in arm.sweep.cells if c.mode != "rate"]
        shapes += [c.shape for c in by_level if c.shape not in shapes]
        levels += [c.concurrency for c in by_level if c.concurrency not in levels]
    if not levels:
        return []
    grids = []
    for shape in shapes:
        cells: dict[tuple[str, int], SweepCell] = {}
        counts: dict[str, dict[str, int] | None] = {}
        notes: dict[str, str] = {}
        for arm in arms:
            status = arm.status("sweep")
            if arm.sweep is None:
                kind = "not run" if status == "not run" else "job failed"
                reason = arm.reason("sweep") or (
                    "no readable summary.json" if kind == "job failed" else None
                )
                notes[arm.label] = f"{kind}: {reason}" if reason else kind
                counts[arm.label] = None
                for level in sorted(levels):
                    cells[(arm.label, level)] = SweepCell(arm.label, shape, level, kind, reason)
                continue
            counts[arm.label] = dict(arm.sweep.counts)
            if status == "failed":
                notes[arm.label] = f"job failed: {arm.reason('sweep')}"
            for level in sorted(levels):
                cells[(arm.label, level)] = _sweep_cell(arm, arm.sweep, shape, level, slo)
        grids.append(
            SweepGrid(
                shape=shape,
                levels=sorted(levels),
                arms=[a.label for a in arms],
                cells=cells,
                counts=counts,
                arm_notes=notes,
            )
        )
    return grids


def best_rows(
    arms: Sequence[ArmResults], grids: Sequence[SweepGrid]
) -> tuple[dict[str, list[BestRow]], list[str]]:
    by_label = {a.label: a for a in arms}
    group = engine_groups(arms)
    engines = list(dict.fromkeys(group(a) for a in arms if a.sweep is not None))
    out: dict[str, list[BestRow]] = {}
    for grid in grids:
        rows = []
        for level in grid.levels:
            per_engine: dict[str, BestCell | None] = {}
            for engine in engines:
                candidates = [
                    grid.cells[(label, level)]
                    for label in grid.arms
                    if group(by_label[label]) == engine and grid.cells[(label, level)].ranked
                ]
                best = max(candidates, key=lambda c: c.tok_s or 0.0, default=None)
                per_engine[engine] = (
                    BestCell(
                        best.label,
                        best.tok_s or 0.0,
                        best.relative_spread,
                        drafter_label(by_label[best.label]),
                    )
                    if best
                    else None
                )
            ranked = sorted(
                (c for c in per_engine.values() if c is not None),
                key=lambda c: c.tok_s,
                reverse=True,
            )
            winner = next(e for e, c in per_engine.items() if c is ranked[0]) if ranked else None
            clear = None
            if len(ranked) >= 2:
                clear = beyond_spread(
                    ranked[0].tok_s / ranked[1].tok_s,
                    ranked[0].relative_spread,
                    ranked[1].relative_spread,
                )
            rows.append(BestRow(grid.shape, level, per_engine, winner, clear))
        out[grid.shape] = rows
    return out, engines
