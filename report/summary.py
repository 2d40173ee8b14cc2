"""The seeds' compare-and-contrast summary (seed 000's closing table), from the results.

One column per engine (on each GPU where the results span several), one row per question:
- 1 request, best: the engine's fastest one-request arm (e2e tok/s);
- N requests, SHAPE, best: its best arm at the highest level of each shape;
- drafter under load: its best drafter arm against its best plain arm, level by level, on
  the first shape: "pays at every level", "pays to N", or the ratio where it loses;
- GSM8K / BFCL level: every arm of the engine level with the baseline arm (the paired
  95% interval of the difference contains zero), else how many questions behind;
- runs as installed: from the manifest's install facts (patches applied, extra packages,
  built from source) where the agent recorded them; "not recorded" where it did not.
Marks: 🥇 the best figure of a row; 🟢 yes; ⚠️ a caveat; ❌ no; ≈ within the spread.
"""

from __future__ import annotations

from collections.abc import Sequence

from report.arms import engine_groups, is_drafter
from report.load import ArmResults
from report.rows import Report, beyond_spread
from report.tables import GOLD, Table, fmt

__all__ = ["install_facts", "summary_table"]

_TITLES = {"gsm8k": "GSM8K", "bfcl": "BFCL"}


def install_facts(arms: Sequence[ArmResults]) -> str:
    """'🟢 yes', '❌ 2 patches', '⚠️ needs X' from the manifest where recorded."""
    patches: list[str] = []
    extras: list[str] = []
    recorded = False
    built = False
    for arm in arms:
        engine = arm.engine
        if engine is None:
            continue
        if engine.patches is not None:
            recorded = True
            patches += [p for p in engine.patches if p not in patches]
        if engine.extra_packages is not None:
            recorded = True
            extras += [e for e in engine.extra_packages if e not in extras]
        if engine.built_from_source is not None:
            recorded = True
            built = built or engine.built_from_source
    if not recorded:
        return "not recorded"
    if patches:
        return f"❌ {len(patches)} patch{'es' if len(patches) > 1 else ''}"
    if extras:
        return f"⚠️ needs {', '.join(extras)}"
    return "🟢 yes, built from source" if built else "🟢 yes"


def _drafter_verdict(report: Report, members: Sequence[ArmResults]) -> str:
    drafted = [a.label for a in members if is_drafter(a)]
    plain = [a.label for a in members if not is_drafter(a)]
    if not drafted:
        return "—"
    if not plain or not report.sweeps:
        return "no plain arm to compare" if not plain else "no sweep"
    grid = report.sweeps[0]
    pays: list[tuple[int, bool, float, bool | None]] = []
    for level in grid.levels:
        best_d = max((grid.cells[(d, level)] for d in drafted), key=lambda c: c.tok_s or 0)
        best_p = max((grid.cells[(p, level)] for p in plain), key=lambda c: c.tok_s or 0)
        if not (best_d.ranked and best_p.ranked and best_d.tok_s and best_p.tok_s):
            continue
        ratio = best_d.tok_s / best_p.tok_s
        differs = beyond_spread(ratio, best_d.relative_spread, best_p.relative_spread)
        pays.append((level, ratio > 1 and differs is not False, ratio, differs))
    if not pays:
        return "no level measured both"
    first_loss = next((i for i, step in enumerate(pays) if not step[1]), None)
    if first_loss is None:
        return "🟢 pays at every level"

    def loss(step: tuple[int, bool, float, bool | None]) -> str:
        level, _, ratio, differs = step
        return f"{ratio:.2f}x{' ≈' if differs is False else ''} at {level}"

    if first_loss == 0:
        return f"❌ {loss(pays[-1])}"
    return f"⚠️ pays to {pays[first_loss - 1][0]}; {loss(pays[first_loss])}"


def _accuracy_verdict(report: Report, item: str, labels: set[str]) -> str:
    rows = [r for r in report.accuracy.get(item, []) if r.label in labels]
    if not rows:
        return "not run"
    verdicts = []
    for r in rows:
        if r.label == report.baseline:
            verdicts.append("baseline")
        elif r.comparison is not None:
            c = r.comparison
            net = len(c.flipped_to_wrong) - len(c.flipped_to_correct)
            if c.verdict == "level":
                verdicts.append("level")
            else:
                verdicts.append(f"{net} behind" if net > 0 else f"{-net} ahead")
        else:
            verdicts.append(r.status if r.score is None else "not compared")
    if all(v in ("level", "baseline") for v in verdicts):
        return "🟢 yes" + (" (baseline)" if "baseline" in verdicts else "")
    lost = [v for v in verdicts if v.endswith("behind")]
    if lost:
        return "❌ " + ", ".join(lost)
    return "⚠️ " + ", ".join(sorted(set(verdicts) - {"level", "baseline"}))


def summary_table(report: Report) -> Table | None:
    arms = report.results.arms()
    group = engine_groups(arms)
    engines: dict[str, list[ArmResults]] = {}
    for arm in arms:
        if arm.ran:
            engines.setdefault(group(arm), []).append(arm)
    if not engines:
        return None
    names = list(engines)
    probe = {r.label: r for r in report.probe}
    rows: list[tuple[str, ...]] = []
    ones = {
        e: max((probe[a.label].e2e_tok_s or 0.0 for a in m if a.label in probe), default=0.0)
        for e, m in engines.items()
    }
    top = max(ones.values(), default=0.0)
    rows.append(
        (
            "1 request, best",
            *(
                "-" if not ones[e] else (f"{GOLD} " if ones[e] == top else "") + fmt(ones[e])
                for e in names
            ),
        )
    )
    for shape, best_rows in report.best.items():
        if not best_rows:
            continue
        last = best_rows[-1]
        figures = {e: c.tok_s for e, c in last.per_engine.items() if c is not None}
        lead = max(figures.values(), default=None)
        cells = []
        for e in names:
            value = figures.get(e)
            if value is None:
                cells.append("-")
            else:
                gold = f"{GOLD} " if value == lead and last.clear else ""
                cells.append(gold + fmt(value, 0))
        rows.append((f"{last.concurrency} requests, {shape}, best", *cells))
    if report.sweeps:
        rows.append(
            (
                f"Drafter under load, {report.sweeps[0].shape}",
                *(_drafter_verdict(report, engines[e]) for e in names),
            )
        )
    for item in report.accuracy:
        rows.append(
            (
                f"{_TITLES.get(item, item)} level",
                *(_accuracy_verdict(report, item, {a.label for a in engines[e]}) for e in names),
            )
        )
    rows.append(("Runs as installed", *(install_facts(engines[e]) for e in names)))
    return Table(
        key="summary",
        title="Compare and contrast",
        columns=("", *names),
        rows=rows,
        caption=(
            f"{GOLD}: the best of the row (at a level only where the lead beats the run-to-run "
            "spread). Drafter under load: the best drafter arm against the best plain arm at "
            "each level, 'pays' where it is faster beyond the spread. Accuracy: level with "
            f"the baseline arm {report.baseline} by the paired test, or questions behind "
            "(net flips). Runs as installed: the manifest's install facts (patches, extra "
            "packages, build from source), 'not recorded' where the agent did not record them."
        ),
    )
