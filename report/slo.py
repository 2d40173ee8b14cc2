"""Latency objectives: which SLO applies, and each engine's highest level that meets it.

The SLO comes from the campaign spec's sweep settings (`slo_ttft_ms`, `slo_tpot_ms`, and
`slo_e2el_ms` where the spec has it), each overridable from `bench report --slo-*-ms`. A
cell meets it when every given objective holds at the cell's p99 (`Slo.judge`). The
headline row per engine (on each GPU) and shape is the highest concurrency level at which
one of its arms meets the SLO, with that cell's aggregate tok/s, its $/M tokens on demand
and its J/token: the throughput an engine can actually sell under the latency budget.
"""

from __future__ import annotations

from collections.abc import Sequence

from contract.suite import SweepSettings
from report.arms import engine_groups
from report.load import ArmResults
from report.rows import CostPoint, EnergyCell, Slo, SloRow, SweepCell, SweepGrid

__all__ = ["resolve_slo", "slo_rows"]


def resolve_slo(
    settings: SweepSettings | None,
    *,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    e2el_ms: float | None = None,
) -> Slo:
    """The report's SLO: each objective from the flag where given, else from the spec."""
    return Slo(
        ttft_ms=ttft_ms if ttft_ms is not None else getattr(settings, "slo_ttft_ms", None),
        tpot_ms=tpot_ms if tpot_ms is not None else getattr(settings, "slo_tpot_ms", None),
        e2el_ms=e2el_ms if e2el_ms is not None else getattr(settings, "slo_e2el_ms", None),
    )


def slo_rows(
    arms: Sequence[ArmResults],
    grids: Sequence[SweepGrid],
    cost_points: Sequence[CostPoint],
    energy_cells: Sequence[EnergyCell],
    slo: Slo,
) -> list[SloRow]:
    if not slo.given:
        return []
    group = engine_groups(arms)
    by_label = {a.label: a for a in arms}
    usd = {(p.label, p.shape, p.concurrency): p.on_demand_usd_per_m for p in cost_points}
    joules = {(e.label, e.shape, e.concurrency): e.joules_per_token for e in energy_cells}
    engines = list(dict.fromkeys(group(a) for a in arms if a.sweep is not None))
    rows = []
    for grid in grids:
        for engine in engines:
            cells = [
                c
                for c in grid.cells.values()
                if c.label in by_label and group(by_label[c.label]) == engine and c.ranked
            ]
            meeting = [c for c in cells if c.meets_slo]
            best: SweepCell | None = max(
                meeting, key=lambda c: (c.concurrency, c.tok_s or 0.0), default=None
            )
            tried = len({c.concurrency for c in cells})
            if best is None:
                rows.append(SloRow(engine, grid.shape, None, levels_tried=tried))
                continue
            key = (best.label, grid.shape, best.concurrency)
            rows.append(
                SloRow(
                    engine=engine,
                    shape=grid.shape,
                    concurrency=best.concurrency,
                    label=best.label,
                    tok_s=best.tok_s,
                    user_decode_p50_tok_s=best.user_decode_p50_tok_s,
                    ttft_p99_ms=best.ttft_p99_ms,
                    on_demand_usd_per_m=usd.get(key),
                    joules_per_token=joules.get(key),
                    levels_tried=tried,
                )
            )
    return rows
