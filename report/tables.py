"""The report's rows as text tables, laid out like the seeds' so numbers can be compared.

A `Table` is plain text cells with a title and a caption; `render` writes it as Markdown or
HTML and the CLI as a rich table. Formatting only: every figure comes from `report.build`.

Marks used in cells (explained in each caption):
- "≈" after a ratio: within the run-to-run spread, not a difference;
- "🥇" before the fastest engine at a level, only where its lead beats the spread;
- "†" (and grey in HTML) on a sweep cell that misses the SLO;
- a status word (infeasible, failed, not run, job failed) where a cell has no figure, and
  "partial, N failed" before the figure of a cell that lost requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from report.rows import (
    AccuracyRow,
    DrafterRow,
    ProbeRow,
    Report,
    Spread,
    SweepGrid,
)

__all__ = [
    "NOT_A_DIFFERENCE",
    "Table",
    "accuracy_tables",
    "all_tables",
    "best_tables",
    "cost_tables",
    "drafter_table",
    "energy_tables",
    "eval_time_table",
    "fmt",
    "probe_table",
    "sweep_tables",
]

NOT_A_DIFFERENCE = "≈"
SLO_MISS = "†"
GOLD = "🥇"


@dataclass(frozen=True)
class Table:
    key: str  # a stable id: 'probe', 'sweep-in512-out128', ...
    title: str
    columns: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]
    caption: str = ""
    notes: list[str] = field(default_factory=list)
    align_left: int = 1  # how many leading columns are text (left-aligned)
    muted: frozenset[tuple[int, int]] = frozenset()  # (row, column): greyed, e.g. misses the SLO


def fmt(value: float | None, digits: int = 1) -> str:
    """Thousands separators as the seeds print them; '-' for no value."""
    return "-" if value is None else f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    # The seeds print whole milliseconds; a tiny model's few-ms TTFT keeps one decimal.
    if value is None:
        return "-"
    return fmt(value, 1 if value < 10 else 0)


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 0.1:
        return f"${value:,.2f}"
    return f"${value:.3g}"


def _spread(spread: Spread | None, digits: int = 1) -> str:
    if spread is None:
        return "-"
    return f"{fmt(spread.low, digits)}–{fmt(spread.high, digits)} (n={spread.n})"


def _ratio(value: float | None, differs: bool | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return f"{text} {NOT_A_DIFFERENCE}" if differs is False else text


def _status(status: str, reason: str | None) -> str:
    return f"{status}: {reason}" if reason else status


def _same_text_notes(rows: Sequence[ProbeRow]) -> list[str]:
    """Arms whose probe wrote the same greedy text, byte for byte: an arm with a drafter
    beside its own without one, say, or one engine on two GPUs."""
    by_text: dict[str, list[str]] = {}
    for r in rows:
        if r.texts_sha256:
            by_text.setdefault(r.texts_sha256, []).append(r.label)
    groups = [labels for labels in by_text.values() if len(labels) > 1]
    if not groups:
        return []
    same = "; ".join(" = ".join(labels) for labels in groups)
    return [f"The same greedy text in every prompt, byte for byte: {same}."]


def probe_table(report: Report) -> Table:
    rows = []
    for r in report.probe:
        if r.e2e_tok_s is None:
            rows.append((r.label, _status(r.status, r.reason), *(["-"] * 10)))
            continue
        memory = "-"
        if r.memory_mib is not None:
            memory = fmt(r.memory_mib, 0) + (" RSS" if r.memory_kind == "rss" else "")
        rows.append(
            (
                r.label,
                fmt(r.e2e_tok_s),
                "1.000" if r.label == report.baseline else _ratio(r.x_baseline, r.differs),
                fmt(r.decode_tok_s),
                _ms(r.ttft_ms),
                fmt(r.at_once_tok_s),
                fmt(r.x_one, 2),
                memory,
                fmt(r.ready_s, 1),
                f"{r.repeat_identical}/{r.prompts}",
                _spread(r.e2e_spread),
                str(r.requests_ok)
                + (f" ({r.requests_failed} failed)" if r.requests_failed else ""),
            )
        )
    at_once = next((r.at_once for r in report.probe if r.at_once), 4)
    return Table(
        key="probe",
        title="One request",
        columns=(
            "arm",
            "e2e tok/s",
            f"x {report.baseline}",
            "decode",
            "TTFT ms",
            f"{at_once} at once",
            "x one",
            "memory MiB",
            "ready s",
            "repeat",
            "spread (repeats)",
            "n",
        ),
        rows=rows,
        caption=(
            "e2e tok/s: per prompt the median over repeats, across prompts the geometric "
            "mean; decode = 1/TPOT; TTFT: median of every request; at once: aggregate "
            "tok/s of that many requests sent together, x one its ratio to e2e; memory: "
            "peak GPU memory during the probe (RSS = the engine's resident memory where no "
            "GPU was sampled); ready s: health 200 then first completion; repeat: prompts "
            "whose greedy text was byte-identical across repeats; spread: each repeat's "
            "geometric mean, min–max; n: requests. "
            f"{NOT_A_DIFFERENCE}: the ratio is within the run-to-run spread, not a difference."
        ),
        notes=_same_text_notes(report.probe),
        align_left=1,
    )


def _tokens_text(row: DrafterRow) -> str:
    if row.best_tok_s is None:
        return "—" if row.best is None else f"{row.best}: no figure"
    return f"{fmt(row.best_tok_s)} ({row.tokens}, {row.best})"


def _acceptance_text(row: DrafterRow) -> str:
    if row.best is None:
        return "—"
    if not row.acceptance_recorded:
        return "not exposed by the engine"
    rate = "-" if row.acceptance_rate is None else f"{100 * row.acceptance_rate:.1f}%"
    if row.mean_accepted_length is not None:
        rate += f", mean length {row.mean_accepted_length:.2f}"
    return rate


def drafter_table(report: Report) -> Table:
    rows = []
    best_gain = max((r.gain for r in report.drafters if r.gain and r.differs), default=None)
    for r in report.drafters:
        best = _tokens_text(r)
        if best_gain is not None and r.gain == best_gain and r.best_tok_s is not None:
            best = f"{GOLD} {best}"
        rows.append(
            (
                r.engine,
                "—"
                if r.plain is None
                else f"{fmt(r.plain_tok_s)} ({r.plain})"
                if r.plain_tok_s is not None
                else f"{r.plain_status} ({r.plain})",
                best,
                "—" if r.gain is None else _ratio(r.gain, r.differs, 2) + "x",
                _acceptance_text(r),
            )
        )
    return Table(
        key="drafter",
        title="Drafter: one request, e2e tok/s",
        columns=("engine", "no drafter", "best drafter (tokens)", "gain", "acceptance"),
        rows=rows,
        caption=(
            "Best drafter: the fastest drafter arm of the engine; gain = best drafter / no "
            f"drafter. {NOT_A_DIFFERENCE}: within the run-to-run spread of either arm. "
            "— : the engine ran no such arm. Acceptance: accepted / drafted tokens of the "
            "best drafter arm, and the mean accepted length per draft step (the target's own "
            "token included), where the engine exposed its counters."
        ),
    )


def _sweep_cell_text(grid: SweepGrid, label: str, level: int) -> str:
    cell = grid.cells[(label, level)]
    if cell.status == "partial" and cell.tok_s is not None:
        return f"partial, {cell.requests_failed} failed: {fmt(cell.tok_s)}"
    if cell.tok_s is None:
        return (
            _status(cell.status, cell.reason)
            if cell.status in ("infeasible", "failed")
            else (cell.status)
        )
    text = fmt(cell.tok_s)
    if cell.spread is not None and cell.spread.n >= 2:
        text += f" ({fmt(cell.spread.low)}–{fmt(cell.spread.high)})"
    return f"{text} {SLO_MISS}" if cell.meets_slo is False else text


def sweep_tables(report: Report) -> list[Table]:
    tables = []
    for grid in report.sweeps:
        rows = [
            (str(level), *(_sweep_cell_text(grid, label, level) for label in grid.arms))
            for level in grid.levels
        ]
        muted = frozenset(
            (i, j + 1)
            for i, level in enumerate(grid.levels)
            for j, label in enumerate(grid.arms)
            if grid.cells[(label, level)].meets_slo is False
        )
        counts = []
        for label in grid.arms:
            c = grid.counts.get(label)
            if c is None:
                counts.append(f"{label}: {grid.arm_notes.get(label, 'no sweep')}")
            else:
                counts.append(
                    f"{label}: {c.get('measured', 0)} measured / {c.get('partial', 0)} partial / "
                    f"{c.get('failed', 0)} failed / {c.get('infeasible', 0)} infeasible"
                    + (f" ({grid.arm_notes[label]})" if label in grid.arm_notes else "")
                )
        repeats = max(
            (c.spread.n for c in grid.cells.values() if c.spread is not None), default=None
        )
        tables.append(
            Table(
                key=f"sweep-{grid.shape}",
                title=f"Aggregate output tok/s, {grid.shape}",
                columns=("requests", *grid.arms),
                rows=rows,
                caption=(
                    "Median of the repeats"
                    + (f" (n={repeats})" if repeats else "")
                    + ", min–max in brackets; every cell shown, with its status where it "
                    "has no figure; a partial cell lost requests and is never ranked. "
                    + (
                        f"{SLO_MISS} and greyed: misses the SLO ({report.slo.describe()}). "
                        if muted
                        else ""
                    )
                    + "Cell counts over each arm's whole sweep (every shape): "
                    + "; ".join(counts)
                    + "."
                ),
                muted=muted,
            )
        )
    return tables


def best_tables(report: Report) -> list[Table]:
    tables = []
    for shape, rows in report.best.items():
        out = []
        for row in rows:
            cells = []
            for engine in report.engines:
                best = row.per_engine.get(engine)
                if best is None:
                    cells.append("-")
                    continue
                text = f"{fmt(best.tok_s)} ({best.drafter}, {best.label})"
                if engine == row.winner and row.clear:
                    text = f"{GOLD} {text}"
                elif engine == row.winner and row.clear is False:
                    text = f"{text} {NOT_A_DIFFERENCE}"
                cells.append(text)
            out.append((str(row.concurrency), *cells))
        tables.append(
            Table(
                key=f"best-{shape}",
                title=f"Best per level, {shape}: each engine's fastest arm",
                columns=("requests", *report.engines),
                rows=out,
                caption=(
                    f"{GOLD}: the fastest engine at that level, its lead over the next "
                    f"beyond the run-to-run spread; {NOT_A_DIFFERENCE} on the fastest: its "
                    "lead is within the spread (not a difference)."
                ),
            )
        )
    return tables


def _points(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}"


def _accuracy_row(row: AccuracyRow, baseline: str) -> tuple[str, ...]:
    if row.score is None and row.answered is None:
        return (row.label, _status(row.status, row.reason), *(["-"] * 7))
    done = "" if row.complete else " (incomplete)"
    c = row.comparison
    if row.label == baseline:
        diff, interval, verdict = "baseline", "-", "-"
    elif c is None:
        diff, interval, verdict = "-", row.comparison_note or "-", "-"
    else:
        diff = f"{_points(c.difference)} pts"
        interval = f"[{_points(c.ci_low)}, {_points(c.ci_high)}]"
        verdict = c.verdict + (
            f" (+{len(c.flipped_to_correct)}/-{len(c.flipped_to_wrong)} flips, p={c.mcnemar_p:.2g})"
        )
    ratio = f" ({c.time_ratio:.2f}x)" if c is not None and c.time_ratio is not None else ""
    return (
        row.label,
        fmt(row.score, 4),
        f"{row.correct}/{row.answered}{done}",
        str(row.truncated) if row.truncated is not None else "-",
        str(row.failed) if row.failed is not None else "-",
        diff,
        interval,
        verdict,
        (fmt(row.wall_s, 1) + " s" + ratio) if row.wall_s is not None else "-",
    )


_EVAL_TITLES = {"gsm8k": "GSM8K", "bfcl": "BFCL simple"}


def accuracy_tables(report: Report) -> list[Table]:
    tables = []
    for item, rows in report.accuracy.items():
        tables.append(
            Table(
                key=f"accuracy-{item}",
                title=f"Accuracy, {_EVAL_TITLES.get(item, item)}",
                columns=(
                    "arm",
                    "score",
                    "correct/answered",
                    "truncated",
                    "failed",
                    f"vs {report.baseline}",
                    "95% interval",
                    "level?",
                    "time to finish",
                ),
                rows=[_accuracy_row(r, report.baseline) for r in rows],
                caption=(
                    "Paired question by question with the baseline arm: difference in "
                    "percentage points, Newcombe's 95% interval for paired proportions, "
                    "'level' when it contains zero, flips to right/wrong and the exact "
                    "McNemar p; time to finish with its ratio to the baseline's."
                ),
            )
        )
    return tables


def eval_time_table(report: Report) -> Table | None:
    rows = [r for r in report.eval_times if r.drafted is not None]
    if not rows:
        return None
    return Table(
        key="gsm8k-time",
        title="Time to finish GSM8K, with and without a drafter",
        columns=("engine", "no drafter", "with drafter", "speedup"),
        rows=[
            (
                r.engine,
                f"{fmt(r.plain_s, 0)} s ({r.plain})" if r.plain_s is not None else "—",
                f"{fmt(r.drafted_s, 0)} s ({r.drafted})" if r.drafted_s is not None else "—",
                f"{r.speedup:.2f}x" if r.speedup else "—",
            )
            for r in rows
        ],
        caption="Complete runs only; the fastest drafter arm of each engine.",
    )


def cost_tables(report: Report) -> list[Table]:
    tables = []
    shards = {c.shard: c for c in report.shard_costs}
    priced = [c for c in report.shard_costs if c.on_demand is not None or c.spot is not None]
    rows: list[tuple[str, ...]] = []
    if priced:
        for c in report.shard_costs:
            price = f"${c.on_demand.usd_per_hour:,.4f}/h" if c.on_demand else "-"
            spot = (
                f"${c.spot.usd_per_hour_mean:.4g}/h mean "
                f"(${c.spot.usd_per_hour_min:.4g}–${c.spot.usd_per_hour_max:.4g}, "
                f"{c.spot.changes} price(s))"
                if c.spot
                else ("not available" if c.market == "spot" else "-")
            )
            rows.append(
                (
                    c.shard,
                    c.instance_type,
                    c.market or "-",
                    fmt(c.hours, 2),
                    fmt(c.install_hours, 2),
                    price,
                    _usd(c.on_demand_usd()),
                    _usd(c.on_demand_usd(with_install=False)),
                    spot,
                    _usd(c.spot_usd()),
                    _usd(c.spot_usd(with_install=False)),
                )
            )
        sources = [f"{c.instance_type}: {c.on_demand.source}" for c in priced if c.on_demand]
        spot_sources = sorted({c.spot.source for c in priced if c.spot})
        tables.append(
            Table(
                key="cost-campaign",
                title="Campaign cost from instance hours",
                columns=(
                    "shard",
                    "instance",
                    "market",
                    "hours",
                    "install h",
                    "on-demand price",
                    "on-demand $",
                    "on-demand $ less install",
                    "spot paid",
                    "spot $",
                    "spot $ less install",
                ),
                rows=rows,
                caption="On-demand price of "
                + "; ".join(dict.fromkeys(sources))
                + (". Spot: " + "; ".join(spot_sources) if spot_sources else "")
                + ". Hours from the manifest (agent start to end); install hours = the "
                "engines' install time.",
                align_left=3,
            )
        )
    for shape in report.shapes:
        points = [p for p in report.cost_points if p.shape == shape]
        if not points or all(p.on_demand_usd_per_m is None for p in points):
            continue
        labels = list(dict.fromkeys(p.label for p in points))
        levels = sorted({p.concurrency for p in points})
        spot_any = any(p.spot_usd_per_m is not None for p in points)
        rows = []
        for label in labels:
            cells = []
            for level in levels:
                point = next(
                    (p for p in points if p.label == label and p.concurrency == level), None
                )
                if point is None:
                    cells.append("-")
                    continue
                text = _usd(point.on_demand_usd_per_m)
                if point.spot_usd_per_m is not None:
                    text += f" / {_usd(point.spot_usd_per_m)} spot"
                cells.append(text)
            shard = shards[next(p.shard for p in points if p.label == label)]
            rows.append((label, shard.instance_type, *cells))
        tables.append(
            Table(
                key=f"cost-{shape}",
                title=f"$ per million output tokens, {shape}",
                columns=("arm", "instance", *(f"{n} req" for n in levels)),
                rows=rows,
                caption=(
                    "= price per hour / (3600 x aggregate tok/s) x 1e6, at each measured "
                    "level; on-demand"
                    + (", and the spot price actually paid (time-weighted)" if spot_any else "")
                    + ". Cells without a measured figure are '-'."
                ),
                align_left=2,
            )
        )
    return tables


def energy_tables(report: Report) -> list[Table]:
    tables: list[Table] = []
    if not report.gpu_sampled:
        return tables
    for shape in report.shapes:
        cells = [c for c in report.energy_cells if c.shape == shape]
        if not cells:
            continue
        labels = list(dict.fromkeys(c.label for c in cells))
        levels = sorted({c.concurrency for c in cells})
        rows = []
        for level in levels:
            row = [str(level)]
            for label in labels:
                cell = next((c for c in cells if c.label == label and c.concurrency == level), None)
                row.append(fmt(cell.joules_per_token, 3) if cell else "-")
            rows.append(tuple(row))
        tables.append(
            Table(
                key=f"energy-{shape}",
                title=f"Energy, joules per output token, {shape}",
                columns=("requests", *labels),
                rows=rows,
                caption=(
                    "NVML energy counter over each cell's measured windows / their output "
                    "tokens (all GPUs); '-' where the counter was not read."
                ),
            )
        )
    job_rows = [
        (
            j.label,
            j.item,
            fmt(j.joules_per_token, 3),
            fmt(j.energy_j, 0),
            str(j.output_tokens) if j.output_tokens is not None else "-",
            fmt(j.mean_power_w, 1),
            str(j.gpu_samples),
        )
        for j in report.job_energy
    ]
    tables.append(
        Table(
            key="energy-jobs",
            title="Energy per job",
            columns=("arm", "job", "J/token", "energy J", "output tokens", "mean W", "samples"),
            rows=job_rows,
            caption="From each job's telemetry summary (the counter's delta over the job).",
            align_left=2,
        )
    )
    return tables


def all_tables(report: Report) -> list[Table]:
    tables = [probe_table(report), drafter_table(report)]
    tables += sweep_tables(report) + best_tables(report) + accuracy_tables(report)
    extra = eval_time_table(report)
    if extra:
        tables.append(extra)
    return tables + cost_tables(report) + energy_tables(report)
