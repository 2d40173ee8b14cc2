"""The report's content as typed rows: what each table shows, before any formatting.

Every number here is read from a summary the agent wrote, or is the documented arithmetic
on such numbers: a ratio of two of them, a price divided by a throughput, an energy divided
by tokens. Statistics that need the raw records are computed by the code that defines them
(`agent.metrics` for the probe's per-repeat figures, `agent.evals.compare` for the paired
accuracy comparison, `agent.telemetry.summary` for energy).

Run-to-run spread, and when a ratio is "not a difference":
- probe: the geometric mean over the six prompts of each repeat on its own (n = repeats),
  min to max; the table's e2e figure stays the summary's (per-prompt medians, then the
  geometric mean);
- sweep cell: its repeats' aggregate tok/s, min to max (n = repeats);
- relative spread = (max - min) / the figure. A ratio r of two figures differs only if
  |r - 1| exceeds the larger relative spread of the two; otherwise the report marks it
  as not a difference (≈). With no spread known (one repeat), it is not marked either way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from agent import metrics
from agent.evals.compare import compare_runs, load_run
from agent.evals.task import DataError
from contract.evals import Comparison, EvalSummary
from contract.gpus import gpu_family
from contract.results import RequestRecord, SweepSummary
from contract.spec import LOCAL_INSTANCE_TYPE
from report.energy import CellEnergy, read_gpu_series, sweep_energy
from report.load import ITEMS, ArmResults, CampaignResults, ShardResults, requests_path
from report.prices import HourlyPrice, PriceBook, SpotPaid

__all__ = [
    "ENGINE_NAMES",
    "AccuracyRow",
    "BestCell",
    "BestRow",
    "CostPoint",
    "DrafterRow",
    "EnergyCell",
    "EvalTimeRow",
    "JobEnergy",
    "ProbeRow",
    "Report",
    "ShardCost",
    "Spread",
    "SweepCell",
    "SweepGrid",
    "beyond_spread",
    "build_report",
    "usd_per_million",
]

# How the seeds name the engines in their tables.
ENGINE_NAMES = {
    "llamacpp": "llama.cpp",
    "vllm": "vLLM",
    "sglang": "SGLang",
    "mistralrs": "mistral.rs",
    "pytorch": "PyTorch",
    "litertlm": "LiteRT-LM",
}
_DRAFT = re.compile(r"-d(\d*)$")
_PROBE_LABEL = re.compile(r"^probe/p(\d+)/r(\d+)$")


@dataclass(frozen=True, slots=True)
class Spread:
    """Run-to-run spread of one figure: the lowest and highest of n repeats."""

    low: float
    high: float
    n: int

    def relative(self, centre: float | None) -> float | None:
        if centre is None or centre <= 0 or self.n < 2:
            return None
        return (self.high - self.low) / centre


def beyond_spread(ratio: float | None, *relative_spreads: float | None) -> bool | None:
    """True if the ratio differs from 1 by more than every given relative spread; None when
    it cannot be told (no ratio, or no spread known for either side)."""
    known = [s for s in relative_spreads if s is not None]
    if ratio is None or not known:
        return None
    return abs(ratio - 1.0) > max(known)


def usd_per_million(usd_per_hour: float, tok_s: float | None) -> float | None:
    """$ per million output tokens = price per hour / (3600 x tok/s) x 1e6."""
    if tok_s is None or tok_s <= 0:
        return None
    return usd_per_hour / (3600.0 * tok_s) * 1e6


# --- rows -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeRow:
    label: str
    engine: str | None
    status: str  # ok, failed, not run
    reason: str | None = None
    e2e_tok_s: float | None = None
    e2e_spread: Spread | None = None
    x_baseline: float | None = None
    differs: bool | None = None  # x_baseline beyond the run-to-run spread
    decode_tok_s: float | None = None
    ttft_ms: float | None = None
    at_once: int | None = None
    at_once_tok_s: float | None = None
    x_one: float | None = None
    memory_mib: float | None = None
    memory_kind: str | None = None  # "gpu" (peak GPU memory), "rss" (engine RSS, no GPU)
    ready_s: float | None = None
    repeat_identical: int | None = None
    prompts: int | None = None
    requests_ok: int = 0
    requests_failed: int = 0

    @property
    def relative_spread(self) -> float | None:
        return self.e2e_spread.relative(self.e2e_tok_s) if self.e2e_spread else None


@dataclass(frozen=True)
class DrafterRow:
    engine: str
    plain: str | None  # the no-drafter arm
    plain_tok_s: float | None
    plain_status: str | None  # its probe's status where it has no figure
    best: str | None  # the fastest drafter arm
    best_tok_s: float | None
    tokens: str | None  # "4 tokens", "1 token", "its own"
    gain: float | None
    differs: bool | None


@dataclass(frozen=True)
class SweepCell:
    label: str
    shape: str
    concurrency: int
    status: str  # ok, partial, infeasible, failed, not run, job failed
    reason: str | None = None
    tok_s: float | None = None
    spread: Spread | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None  # median over repeats of each window's p99

    @property
    def relative_spread(self) -> float | None:
        return self.spread.relative(self.tok_s) if self.spread else None


@dataclass(frozen=True)
class SweepGrid:
    """One shape: every arm at every level, nothing dropped."""

    shape: str
    levels: list[int]
    arms: list[str]
    cells: dict[tuple[str, int], SweepCell]  # (label, level) -> cell
    counts: dict[str, dict[str, int] | None]  # label -> measured/failed/infeasible
    arm_notes: dict[str, str]  # label -> why the whole column is empty


@dataclass(frozen=True)
class BestCell:
    label: str
    tok_s: float
    relative_spread: float | None
    drafter: str  # "4 drafted", "none"


@dataclass(frozen=True)
class BestRow:
    shape: str
    concurrency: int
    per_engine: dict[str, BestCell | None]
    winner: str | None  # engine with the highest figure
    clear: bool | None  # the winner's margin over the runner-up beats the spread


@dataclass(frozen=True)
class AccuracyRow:
    eval: str
    label: str
    status: str  # ok, failed, not run
    reason: str | None = None
    score: float | None = None
    correct: int | None = None
    answered: int | None = None
    questions: int | None = None
    complete: bool | None = None
    truncated: int | None = None
    failed: int | None = None
    wall_s: float | None = None
    comparison: Comparison | None = None  # against the baseline arm's run
    comparison_note: str | None = None


@dataclass(frozen=True)
class EvalTimeRow:
    engine: str
    plain: str | None
    plain_s: float | None
    drafted: str | None
    drafted_s: float | None
    speedup: float | None


@dataclass(frozen=True)
class CostPoint:
    label: str
    shard: str
    shape: str
    concurrency: int
    tok_s: float
    on_demand_usd_per_m: float | None
    spot_usd_per_m: float | None


@dataclass(frozen=True)
class ShardCost:
    shard: str
    instance_type: str
    region: str | None
    market: str | None
    started_unix_s: float
    finished_unix_s: float | None
    hours: float | None
    install_hours: float
    on_demand: HourlyPrice | None
    spot: SpotPaid | None

    def on_demand_usd(self, with_install: bool = True) -> float | None:
        hours = self._hours(with_install)
        return (
            None if self.on_demand is None or hours is None else self.on_demand.usd_per_hour * hours
        )

    def spot_usd(self, with_install: bool = True) -> float | None:
        if self.spot is None:
            return None
        if with_install:
            return self.spot.usd_total
        hours = self._hours(False)
        return None if hours is None else self.spot.usd_per_hour_mean * hours

    def _hours(self, with_install: bool) -> float | None:
        if self.hours is None:
            return None
        return self.hours if with_install else max(0.0, self.hours - self.install_hours)


@dataclass(frozen=True)
class EnergyCell:
    label: str
    shape: str
    concurrency: int
    joules_per_token: float | None
    energy_j: float | None
    output_tokens: int | None


@dataclass(frozen=True)
class JobEnergy:
    label: str
    item: str
    joules_per_token: float | None
    energy_j: float | None
    output_tokens: int | None
    mean_power_w: float | None
    gpu_samples: int


@dataclass
class Report:
    campaign: str
    description: str
    baseline: str
    arms: list[str]
    probe: list[ProbeRow]
    drafters: list[DrafterRow]
    sweeps: list[SweepGrid]
    best: dict[str, list[BestRow]]  # shape -> rows
    engines: list[str]  # engines in the best-per-level tables, in order
    accuracy: dict[str, list[AccuracyRow]]  # eval item -> rows
    eval_times: list[EvalTimeRow]
    shard_costs: list[ShardCost]
    cost_points: list[CostPoint]
    energy_cells: list[EnergyCell]
    job_energy: list[JobEnergy]
    gpu_sampled: bool
    scope: list[str]
    not_measured: list[str]
    price_notes: list[str]
    problems: list[str]
    results: CampaignResults
    shapes: list[str] = field(default_factory=list)


# --- building ---------------------------------------------------------------------------


# An arm that never started has no EngineServed: its engine is told by its name's prefix,
# as engines/recipes spells arms (llama-d2 -> llamacpp).
_PREFIX_ENGINE = {"llama": "llamacpp", "litert": "litertlm"}


def engine_name(arm: ArmResults) -> str:
    if arm.engine is not None:
        engine = arm.engine.engine
    else:
        prefix = arm.arm.split("-", 1)[0]
        engine = _PREFIX_ENGINE.get(prefix, prefix)
    return ENGINE_NAMES.get(engine, engine)


def engine_groups(arms: Sequence[ArmResults]) -> Callable[[ArmResults], str]:
    """How arms are grouped into engines for the drafter, best-per-level and GSM8K-time
    tables: by engine, and by instance type too where the campaign ran on several (a
    drafter's gain or an engine's best is a figure of one GPU)."""
    several = len({a.instance_type for a in arms}) > 1

    def group(arm: ArmResults) -> str:
        name = engine_name(arm)
        return f"{name} ({arm.instance_type})" if several else name

    return group


def drafted_tokens(arm: ArmResults) -> str | None:
    """'4 tokens' for 'vllm-d4', 'its own' for a bare '-d'; None for no drafter."""
    if not arm.drafter and not _DRAFT.search(arm.arm):
        return None
    match = _DRAFT.search(arm.arm)
    if match is None or not match.group(1):
        return "its own"
    n = int(match.group(1))
    return f"{n} token" if n == 1 else f"{n} tokens"


def _is_drafter(arm: ArmResults) -> bool:
    return arm.drafter or _DRAFT.search(arm.arm) is not None


def _probe_spread(path: Path | None) -> tuple[Spread | None, int]:
    """Geometric mean over prompts of each repeat, min to max; and the requests read."""
    if path is None:
        return None, 0
    by_repeat: dict[int, list[float]] = {}
    count = 0
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        record = RequestRecord.model_validate_json(line)
        match = _PROBE_LABEL.match(record.label)
        if match is None or not record.ok:
            continue
        value = metrics.e2e_tok_s(record)
        if value is not None:
            by_repeat.setdefault(int(match.group(2)), []).append(value)
            count += 1
    means = [m for values in by_repeat.values() if (m := metrics.geometric_mean(values))]
    if not means:
        return None, count
    return Spread(min(means), max(means), len(means)), count


def _probe_rows(arms: Sequence[ArmResults], baseline: ArmResults | None) -> list[ProbeRow]:
    base_summary = baseline.probe if baseline else None
    base_spread = (
        _probe_spread(requests_path(baseline, "probe"))[0] if baseline and base_summary else None
    )
    base_rel = (
        base_spread.relative(base_summary.e2e_tok_s) if base_spread and base_summary else None
    )
    rows = []
    for arm in arms:
        summary, record = arm.probe, arm.jobs.get("probe")
        if summary is None:
            rows.append(
                ProbeRow(
                    label=arm.label,
                    engine=engine_name(arm),
                    status=arm.status("probe") if arm.status("probe") != "ok" else "failed",
                    reason=arm.reason("probe") or ("no summary.json" if record else None),
                )
            )
            continue
        spread, _ = _probe_spread(requests_path(arm, "probe"))
        ratio = (
            summary.e2e_tok_s / base_summary.e2e_tok_s
            if summary.e2e_tok_s and base_summary and base_summary.e2e_tok_s
            else None
        )
        rel = spread.relative(summary.e2e_tok_s) if spread else None
        telemetry = arm.telemetry("probe")
        memory, kind = None, None
        if telemetry and telemetry.peak_gpu_memory_mib is not None:
            memory, kind = telemetry.peak_gpu_memory_mib, "gpu"
        elif telemetry and telemetry.engine_rss_mib_peak is not None:
            memory, kind = telemetry.engine_rss_mib_peak, "rss"
        measured = summary.settings.repeats * len(summary.prompts)
        rows.append(
            ProbeRow(
                label=arm.label,
                engine=engine_name(arm),
                status=arm.status("probe"),
                reason=arm.reason("probe"),
                e2e_tok_s=summary.e2e_tok_s,
                e2e_spread=spread,
                x_baseline=ratio,
                differs=None if arm is baseline else beyond_spread(ratio, rel, base_rel),
                decode_tok_s=summary.decode_tok_s,
                ttft_ms=summary.ttft_ms,
                at_once=summary.settings.at_once,
                at_once_tok_s=summary.at_once_aggregate_tok_s,
                x_one=summary.at_once_x_one,
                memory_mib=memory,
                memory_kind=kind,
                ready_s=record.ready_s if record else None,
                repeat_identical=summary.repeat_identical,
                prompts=len(summary.prompts),
                requests_ok=measured + summary.settings.at_once - summary.requests_failed,
                requests_failed=summary.requests_failed,
            )
        )
    return rows


def _drafter_rows(arms: Sequence[ArmResults], probe: Sequence[ProbeRow]) -> list[DrafterRow]:
    by_label = {r.label: r for r in probe}
    group = engine_groups(arms)
    engines: dict[str, list[ArmResults]] = {}
    for arm in arms:
        engines.setdefault(group(arm), []).append(arm)
    rows = []
    for engine, members in engines.items():
        plain = [a for a in members if not _is_drafter(a)]
        drafted = [a for a in members if _is_drafter(a)]
        # The plain arm: the one named like the engine's bare arm (shortest name) among
        # those that measured; the seeds have exactly one.
        plain_arm = min(
            plain, key=lambda a: (by_label[a.label].e2e_tok_s is None, len(a.arm)), default=None
        )
        plain_row = by_label[plain_arm.label] if plain_arm else None
        measured = [a for a in drafted if by_label[a.label].e2e_tok_s is not None]
        best = max(measured, key=lambda a: by_label[a.label].e2e_tok_s or 0.0, default=None)
        best_row = by_label[best.label] if best else None
        gain = (
            best_row.e2e_tok_s / plain_row.e2e_tok_s
            if best_row and plain_row and best_row.e2e_tok_s and plain_row.e2e_tok_s
            else None
        )
        rows.append(
            DrafterRow(
                engine=engine,
                plain=plain_arm.label if plain_arm else None,
                plain_tok_s=plain_row.e2e_tok_s if plain_row else None,
                plain_status=plain_row.status if plain_row else None,
                best=best.label if best else (drafted[0].label if drafted else None),
                best_tok_s=best_row.e2e_tok_s if best_row else None,
                tokens=drafted_tokens(best) if best else None,
                gain=gain,
                differs=beyond_spread(
                    gain,
                    best_row.relative_spread if best_row else None,
                    plain_row.relative_spread if plain_row else None,
                ),
            )
        )
    return rows


def _sweep_cell(arm: ArmResults, summary: SweepSummary, shape: str, level: int) -> SweepCell:
    cell = next((c for c in summary.cells if c.shape == shape and c.concurrency == level), None)
    if cell is None:
        return SweepCell(arm.label, shape, level, "not run", "the sweep did not reach this cell")
    if cell.status not in ("ok", "partial"):
        return SweepCell(arm.label, shape, level, cell.status, cell.reason)
    values = [w.aggregate_output_tok_s for w in cell.repeats if w.aggregate_output_tok_s]
    p99 = metrics.median(w.ttft_ms.p99 for w in cell.repeats if w.ttft_ms.p99 is not None)
    lost = sum(w.requests_failed for w in cell.repeats)
    sent = lost + sum(w.requests_ok for w in cell.repeats)
    return SweepCell(
        label=arm.label,
        shape=shape,
        concurrency=level,
        status=cell.status,
        # A partial cell keeps its figure, always shown with what it lost.
        reason=f"{lost}/{sent} failed" if cell.status == "partial" else None,
        tok_s=cell.aggregate_output_tok_s_median,
        spread=Spread(min(values), max(values), len(values)) if values else None,
        ttft_p50_ms=cell.ttft_ms_p50_median,
        ttft_p99_ms=p99,
    )


def _sweep_grids(arms: Sequence[ArmResults], campaign: CampaignResults) -> list[SweepGrid]:
    spec_sweep = campaign.shards[0].manifest.campaign.suite.sweep
    shapes: list[str] = [s.name for s in spec_sweep.shapes] if spec_sweep else []
    levels: list[int] = list(spec_sweep.levels) if spec_sweep else []
    for arm in arms:
        if arm.sweep is None:
            continue
        shapes += [c.shape for c in arm.sweep.cells if c.shape not in shapes]
        levels += [c.concurrency for c in arm.sweep.cells if c.concurrency not in levels]
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
                cells[(arm.label, level)] = _sweep_cell(arm, arm.sweep, shape, level)
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


def _drafter_label(arm: ArmResults) -> str:
    tokens = drafted_tokens(arm)
    if tokens is None:
        return "none"
    return "own drafter" if tokens == "its own" else f"{tokens.split()[0]} drafted"


def _best_rows(
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
                    if group(by_label[label]) == engine
                    and grid.cells[(label, level)].status == "ok"
                    and grid.cells[(label, level)].tok_s is not None
                ]
                best = max(candidates, key=lambda c: c.tok_s or 0.0, default=None)
                per_engine[engine] = (
                    BestCell(
                        best.label,
                        best.tok_s or 0.0,
                        best.relative_spread,
                        _drafter_label(by_label[best.label]),
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


def _accuracy(
    arms: Sequence[ArmResults], baseline: ArmResults | None, items: Sequence[str]
) -> dict[str, list[AccuracyRow]]:
    out: dict[str, list[AccuracyRow]] = {}
    for item in items:
        base_run = None
        base_note = None
        if baseline is not None and item in baseline.job_dirs:
            try:
                base_run = load_run(baseline.job_dirs[item], baseline.label)
            except DataError as exc:
                base_note = f"baseline {baseline.label}: {exc}"
        elif baseline is not None:
            base_note = f"baseline {baseline.label} has no {item} run"
        rows = []
        for arm in arms:
            summary: EvalSummary | None = arm.evals.get(item)
            if summary is None:
                status = arm.status(item)
                rows.append(
                    AccuracyRow(
                        item,
                        arm.label,
                        "failed" if status == "ok" else status,
                        arm.reason(item) or ("no summary.json" if status == "ok" else None),
                    )
                )
                continue
            comparison, note = None, base_note
            if base_run is not None and arm is not baseline:
                try:
                    comparison = compare_runs(base_run, load_run(arm.job_dirs[item], arm.label))
                except DataError as exc:
                    note = str(exc)
            rows.append(
                AccuracyRow(
                    eval=item,
                    label=arm.label,
                    status=arm.status(item),
                    reason=arm.reason(item),
                    score=summary.score,
                    correct=summary.correct,
                    answered=summary.answered,
                    questions=summary.questions,
                    complete=summary.complete,
                    truncated=summary.truncated,
                    failed=summary.failed,
                    wall_s=summary.wall_s,
                    comparison=comparison,
                    comparison_note=None if arm is baseline else note,
                )
            )
        out[item] = rows
    return out


def _eval_times(arms: Sequence[ArmResults], item: str = "gsm8k") -> list[EvalTimeRow]:
    """Time to finish an eval with and without a drafter, per engine with a drafter arm."""
    group = engine_groups(arms)
    engines: dict[str, list[ArmResults]] = {}
    for arm in arms:
        summary = arm.evals.get(item)
        if summary is not None and summary.complete:
            engines.setdefault(group(arm), []).append(arm)
    rows = []
    for engine, members in engines.items():
        plain = [a for a in members if not _is_drafter(a)]
        drafted = [a for a in members if _is_drafter(a)]
        plain_arm = min(plain, key=lambda a: len(a.arm), default=None)
        fastest = min(drafted, key=lambda a: a.evals[item].wall_s, default=None)
        plain_s = plain_arm.evals[item].wall_s if plain_arm else None
        drafted_s = fastest.evals[item].wall_s if fastest else None
        rows.append(
            EvalTimeRow(
                engine=engine,
                plain=plain_arm.label if plain_arm else None,
                plain_s=plain_s,
                drafted=fastest.label if fastest else None,
                drafted_s=drafted_s,
                speedup=plain_s / drafted_s if plain_s and drafted_s else None,
            )
        )
    return rows


def _shard_window(shard: ShardResults) -> tuple[float, float | None]:
    manifest = shard.manifest
    finished = manifest.finished_unix_s
    if finished is None:
        ends = [r.finished_unix_s for a in shard.arms for r in a.jobs.values()]
        finished = max(ends) if ends else None
    return manifest.started_unix_s, finished


def _costs(
    campaign: CampaignResults, prices: PriceBook, notes: list[str]
) -> tuple[list[ShardCost], dict[str, ShardCost]]:
    costs: list[ShardCost] = []
    for shard in campaign.shards:
        started, finished = _shard_window(shard)
        hours = (finished - started) / 3600.0 if finished else None
        install = sum(e.install_s or 0.0 for e in shard.manifest.engines) / 3600.0
        on_demand = spot = None
        region = shard.region
        if shard.instance_type != LOCAL_INSTANCE_TYPE:
            if region is None:
                region = "us-east-1"
                notes.append(
                    f"shard {shard.name}: no region in its manifest; us-east-1 prices assumed"
                )
            on_demand = prices.on_demand(shard.instance_type, region)
            if on_demand is None:
                notes.append(f"shard {shard.name}: no on-demand price for {shard.instance_type}")
            if shard.market == "spot":
                zone = shard.availability_zone
                if zone is None or finished is None:
                    notes.append(f"shard {shard.name}: spot, but no zone or end time recorded")
                else:
                    spot = prices.spot_paid(shard.instance_type, zone, started, finished)
        costs.append(
            ShardCost(
                shard=shard.name,
                instance_type=shard.instance_type,
                region=region,
                market=shard.market,
                started_unix_s=started,
                finished_unix_s=finished,
                hours=hours,
                install_hours=install,
                on_demand=on_demand,
                spot=spot,
            )
        )
    return costs, {c.shard: c for c in costs}


def _cost_points(
    arms: Sequence[ArmResults], grids: Sequence[SweepGrid], by_shard: dict[str, ShardCost]
) -> list[CostPoint]:
    shard_of = {a.label: a.shard for a in arms}
    points = []
    for grid in grids:
        for label in grid.arms:
            cost = by_shard[shard_of[label]]
            for level in grid.levels:
                cell = grid.cells[(label, level)]
                if cell.tok_s is None or cell.status != "ok":
                    continue
                points.append(
                    CostPoint(
                        label=label,
                        shard=cost.shard,
                        shape=grid.shape,
                        concurrency=level,
                        tok_s=cell.tok_s,
                        on_demand_usd_per_m=usd_per_million(cost.on_demand.usd_per_hour, cell.tok_s)
                        if cost.on_demand
                        else None,
                        spot_usd_per_m=usd_per_million(cost.spot.usd_per_hour_mean, cell.tok_s)
                        if cost.spot
                        else None,
                    )
                )
    return points


def _energy(
    campaign: CampaignResults, grids: Sequence[SweepGrid]
) -> tuple[list[EnergyCell], list[JobEnergy], bool]:
    cells: list[EnergyCell] = []
    jobs: list[JobEnergy] = []
    sampled = False
    for shard in campaign.shards:
        sweeps = {a.jobs["sweep"].job_id: a for a in shard.arms if a.sweep and "sweep" in a.jobs}
        series = read_gpu_series(shard.telemetry_path, sweeps) if shard.telemetry_path else {}
        for arm in shard.arms:
            for item in (i for i in ITEMS if i in arm.jobs):
                telemetry = arm.telemetry(item)
                if telemetry is None:
                    continue
                sampled = sampled or telemetry.gpu_samples > 0
                jobs.append(
                    JobEnergy(
                        label=arm.label,
                        item=item,
                        joules_per_token=telemetry.joules_per_output_token,
                        energy_j=telemetry.energy_j,
                        output_tokens=telemetry.output_tokens,
                        mean_power_w=telemetry.mean_power_w,
                        gpu_samples=telemetry.gpu_samples,
                    )
                )
        for job_id, arm in sweeps.items():
            assert arm.sweep is not None
            found: dict[tuple[str, int], CellEnergy] = sweep_energy(
                arm.sweep, job_id, series.get(job_id), requests_path(arm, "sweep")
            )
            for grid in grids:
                for level in grid.levels:
                    energy = found.get((grid.shape, level))
                    cells.append(
                        EnergyCell(
                            label=arm.label,
                            shape=grid.shape,
                            concurrency=level,
                            joules_per_token=energy.joules_per_token if energy else None,
                            energy_j=energy.energy_j if energy else None,
                            output_tokens=energy.output_tokens if energy else None,
                        )
                    )
    return cells, jobs, sampled


def _when(unix_s: float | None) -> str:
    if unix_s is None:
        return "unfinished"
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _scope(campaign: CampaignResults) -> list[str]:
    lines = []
    spec = campaign.shards[0].manifest.campaign
    model = spec.model.name + (f" with drafter {spec.drafter.name}" if spec.drafter else "")
    lines.append(f"Campaign {spec.name}: {spec.description or 'no description'}; model {model}.")
    for shard in campaign.shards:
        m = shard.manifest
        gpus = sorted({str(g.get("name")) for g in m.gpus}) if m.gpus else []
        family = gpu_family(shard.instance_type)
        gpu = ", ".join(gpus) or (
            f"{family.gpu} expected for {shard.instance_type}, but none was sampled"
            if family
            else "none (CPU only)"
        )
        where = shard.instance_type
        if shard.market:
            where += f" {shard.market}"
        if shard.availability_zone:
            where += f" in {shard.availability_zone}"
        host = m.host
        lines.append(
            f"Shard {shard.name}: {where}; GPU {gpu}; driver {m.nvidia_driver or '-'}, "
            f"CUDA {m.cuda or '-'}; host {host.cpu}, {host.cpus} CPUs, "
            f"{host.memory_mib:,} MiB RAM, {host.os}; agent {m.agent_version} "
            f"(git {(m.git_sha or 'unknown')[:12]}); ran {_when(m.started_unix_s)} to "
            f"{_when(m.finished_unix_s)}."
        )
        for engine in m.engines:
            lines.append(
                f"  {engine.arm}: {ENGINE_NAMES.get(engine.engine, engine.engine)} "
                f"{engine.version} (build {engine.build_id}, variant {engine.variant}), "
                f"model {engine.model}" + (f", drafter {engine.drafter}" if engine.drafter else "")
            )
    suite = spec.suite
    if suite.probe:
        p = suite.probe
        lines.append(
            f"One request: 6 prompts x {p.repeats} repeats of {p.output_tokens} output tokens "
            f"(per prompt the median, across prompts the geometric mean), then {p.at_once} "
            "at once."
        )
    if suite.sweep:
        s = suite.sweep
        lines.append(
            f"Load: shapes {', '.join(sh.name for sh in s.shapes)} at "
            f"{', '.join(map(str, s.levels))} requests, {s.mode} mode, {s.repeats} repeats "
            "per cell (median shown, min-max in brackets), unique nonce-first prompts."
        )
    for name, settings in (("GSM8K", suite.gsm8k), ("BFCL simple", suite.bfcl)):
        if settings:
            amount = f"first {settings.limit}" if settings.limit else "all"
            lines.append(
                f"{name}: {amount} questions, one pass per arm, {settings.max_tokens}-token cap, "
                "greedy, thinking off."
            )
    return lines


def _not_measured(
    campaign: CampaignResults,
    arms: Sequence[ArmResults],
    grids: Sequence[SweepGrid],
    accuracy: dict[str, list[AccuracyRow]],
    gpu_sampled: bool,
) -> list[str]:
    lines = []
    spec = campaign.shards[0].manifest.campaign
    for arm in arms:
        if not arm.ran:
            lines.append(f"{arm.label}: listed in the campaign, no results (not run or lost).")
        for item, record in arm.jobs.items():
            if record.status == "failed":
                lines.append(f"{arm.label} {item}: failed: {record.reason or 'no reason'}.")
    for grid in grids:
        off = [c for c in grid.cells.values() if c.status in ("infeasible", "failed", "not run")]
        if off:
            parts = ", ".join(f"{c.label} at {c.concurrency} ({c.status})" for c in off[:8]) + (
                f" and {len(off) - 8} more" if len(off) > 8 else ""
            )
            lines.append(f"{grid.shape}: cells without a figure: {parts}.")
        partial = [c for c in grid.cells.values() if c.status == "partial"]
        if partial:
            parts = ", ".join(f"{c.label} at {c.concurrency} ({c.reason})" for c in partial[:8])
            lines.append(
                f"{grid.shape}: partial cells (requests failed, figure shown with the loss, "
                f"left out of best-per-level and cost): {parts}"
                + (f" and {len(partial) - 8} more." if len(partial) > 8 else ".")
            )
    for item in ("gsm8k", "bfcl"):
        if item not in spec.suite.items():
            lines.append(f"{item}: not in this campaign's suite.")
    if accuracy:
        lines.append(
            "Accuracy: one pass per arm, so no run-to-run range was measured; 'level' means "
            "the paired 95% interval of the difference contains zero."
        )
    if not gpu_sampled:
        lines.append(
            "No GPU was sampled (no NVML): GPU memory, power and energy were not measured; "
            "the memory column shows the engine's resident memory instead, marked RSS."
        )
    lines.append(
        "Costs are arithmetic from prices and measured throughput, not a bill: instance "
        "hours run from the agent's start to its end (boot before it, storage, transfer "
        "and S3 are not counted)."
    )
    lines.append(
        "Energy is the GPU's own counter only (no CPU, memory or host power); per-level "
        "figures include up to one 100 ms sample of idle time at each window edge."
    )
    return lines


def build_report(
    campaign: CampaignResults, prices: PriceBook, *, baseline: str | None = None
) -> Report:
    """Every table's rows for one campaign; `baseline` names the arm ratios are taken to.

    Raises:
        ValueError: `baseline` is not an arm of the campaign.
    """
    arms = campaign.arms()
    labels = [a.label for a in arms]
    if baseline is None:
        base = next((a for a in arms if a.probe is not None), arms[0] if arms else None)
    else:
        base = campaign.arm(baseline)
        if base is None:
            raise ValueError(f"--baseline {baseline!r} is not an arm here ({', '.join(labels)})")
    spec = campaign.shards[0].manifest.campaign
    probe = _probe_rows(arms, base)
    drafters = _drafter_rows(arms, probe)
    grids = _sweep_grids(arms, campaign)
    best, engines = _best_rows(arms, grids)
    items = [i for i in ("gsm8k", "bfcl") if i in spec.suite.items()]
    items += [i for i in ("gsm8k", "bfcl") if i not in items and any(i in a.evals for a in arms)]
    accuracy = _accuracy(arms, base, items)
    notes: list[str] = []
    shard_costs, by_shard = _costs(campaign, prices, notes)
    energy_cells, job_energy, sampled = _energy(campaign, grids)
    return Report(
        campaign=campaign.campaign,
        description=spec.description,
        baseline=base.label if base else "-",
        arms=labels,
        probe=probe,
        drafters=drafters,
        sweeps=grids,
        best=best,
        engines=engines,
        accuracy=accuracy,
        eval_times=_eval_times(arms),
        shard_costs=shard_costs,
        cost_points=_cost_points(arms, grids, by_shard),
        energy_cells=energy_cells,
        job_energy=job_energy,
        gpu_sampled=sampled,
        scope=_scope(campaign),
        not_measured=_not_measured(campaign, arms, grids, accuracy, sampled),
        price_notes=[*prices.notes, *notes],
        problems=list(campaign.problems),
        results=campaign,
        shapes=[g.shape for g in grids],
    )
