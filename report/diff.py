"""`bench diff OLD NEW`: every cell both results share, old against new, and a gate for CI.

Cells are matched by arm label and cell (one request; or shape and concurrency). Each row
shows aggregate tok/s old and new with their ratio, marked "not a difference" where the
ratio is within the larger run-to-run spread of the two (the report's rule,
`report.rows.beyond_spread`), and the latency p99s' ratios. `--fail-on METRIC:±N%` fails
(exit status 1) when a shared cell's metric moved past the threshold in its direction
(-5%: fell by more than 5%; +10%: rose by more than 10%) and beyond the spread; where no
spread is known (one repeat, or a latency percentile) the threshold alone decides, and the
row says so. Partial and failed cells are listed, never gated on. For each arm whose probe
both ran, a line says whether its greedy text was the same, byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from contract.errors import BenchError
from report.build import build_report
from report.folders import load_folders
from report.prices import PriceBook
from report.rows import Report, beyond_spread
from report.tables import NOT_A_DIFFERENCE, Table, fmt

__all__ = [
    "METRICS",
    "DiffRow",
    "Gate",
    "diff_rows",
    "diff_table",
    "greedy_text_lines",
    "parse_gate",
]

# Metrics a gate may name: (what a sweep cell calls it, what the one-request row calls it).
METRICS: dict[str, tuple[str, str | None]] = {
    "tok_s": ("tok_s", "e2e_tok_s"),
    "user_decode_p50_tok_s": ("user_decode_p50_tok_s", "decode_tok_s"),
    "ttft_p99_ms": ("ttft_p99_ms", None),
    "tpot_p99_ms": ("tpot_p99_ms", None),
    "itl_p99_ms": ("itl_p99_ms", None),
    "latency_p99_ms": ("latency_p99_ms", None),
}
Cells = dict[tuple[str, str], tuple[str, dict[str, float | None], float | None]]
_GATE = re.compile(r"^([a-z0-9_]+):([+-]\d+(?:\.\d+)?)%$")


class GateError(BenchError, ValueError):
    """A --fail-on that cannot be read: one line."""


@dataclass(frozen=True)
class Gate:
    metric: str
    change: float  # -0.05 for "-5%"

    def fails(self, ratio: float | None) -> bool:
        if ratio is None:
            return False
        moved = ratio - 1.0
        return moved < self.change if self.change < 0 else moved > self.change


def parse_gate(text: str) -> Gate:
    match = _GATE.match(text.strip())
    if match is None:
        raise GateError(f"--fail-on {text!r}: expected METRIC:-N% or METRIC:+N%, e.g. tok_s:-5%")
    metric, change = match.group(1), float(match.group(2)) / 100.0
    if metric not in METRICS:
        raise GateError(f"--fail-on {text!r}: metric is one of {', '.join(METRICS)}")
    return Gate(metric, change)


@dataclass(frozen=True)
class DiffRow:
    arm: str
    cell: str  # "one request" or "in512-out128 @ 64"
    old_status: str
    new_status: str
    old: dict[str, float | None]  # metric -> value
    new: dict[str, float | None]
    old_spread: float | None  # relative run-to-run spread of tok/s
    new_spread: float | None

    def ratio(self, metric: str) -> float | None:
        old, new = self.old.get(metric), self.new.get(metric)
        return new / old if old and new is not None else None

    @property
    def comparable(self) -> bool:
        return self.old_status == "ok" and self.new_status == "ok"

    def beyond(self, metric: str) -> bool | None:
        """Past the run-to-run spread; None where no spread is known for the metric."""
        if metric != "tok_s":
            return None
        return beyond_spread(self.ratio(metric), self.old_spread, self.new_spread)

    def regressed(self, gate: Gate) -> bool:
        return (
            self.comparable
            and gate.fails(self.ratio(gate.metric))
            and (self.beyond(gate.metric) is not False)
        )


def _values(
    row: object, names: Sequence[tuple[str, str | None]], probe: bool
) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for metric, (cell_name, probe_name) in zip(METRICS, names, strict=True):
        attr = probe_name if probe else cell_name
        out[metric] = getattr(row, attr, None) if attr else None
    return out


def _cells(report: Report) -> Cells:
    names = list(METRICS.values())
    out: Cells = {}
    for p in report.probe:
        status = "ok" if p.e2e_tok_s is not None else p.status
        out[(p.label, "one request")] = (status, _values(p, names, True), p.relative_spread)
    for grid in report.sweeps:
        for (label, level), c in grid.cells.items():
            status = "ok" if c.ranked else c.status
            key = (label, f"{grid.shape} @ {level}")
            out[key] = (status, _values(c, names, False), c.relative_spread)
    return out


def diff_rows(old: Report, new: Report) -> tuple[list[DiffRow], list[str]]:
    """Rows of every shared cell; and a line per cell found on one side only."""
    before, after = _cells(old), _cells(new)
    rows = []
    for key, (status, values, spread) in before.items():
        if key not in after:
            continue
        new_status, new_values, new_spread = after[key]
        rows.append(
            DiffRow(key[0], key[1], status, new_status, values, new_values, spread, new_spread)
        )
    only = [f"only in OLD: {a} {c}" for a, c in before if (a, c) not in after]
    only += [f"only in NEW: {a} {c}" for a, c in after if (a, c) not in before]
    return rows, only


def greedy_text_lines(old: Report, new: Report) -> list[str]:
    """For each arm whose probe both sides ran: did it write the same greedy text in NEW
    as in OLD (the probe's `texts_sha256`)?"""
    before = {p.label: p.texts_sha256 for p in old.probe if p.e2e_tok_s is not None}
    lines = []
    for p in new.probe:
        if p.label not in before or p.e2e_tok_s is None:
            continue
        was, now = before[p.label], p.texts_sha256
        if was and now:
            verdict = "the same" if was == now else "DIFFERENT"
        else:
            verdict = "not compared (a side lost requests or its text did not repeat)"
        lines.append(f"greedy text of {p.label}'s probe, OLD against NEW: {verdict}")
    return lines


def _ratio_text(row: DiffRow, metric: str) -> str:
    ratio = row.ratio(metric)
    if ratio is None:
        return "-"
    mark = f" {NOT_A_DIFFERENCE}" if row.beyond(metric) is False else ""
    return f"{ratio:.3f}{mark}"


def diff_table(rows: Sequence[DiffRow], gate: Gate | None) -> Table:
    out = []
    for r in rows:
        if not r.comparable:
            verdict = f"not compared ({r.old_status} -> {r.new_status})"
        elif gate is None:
            verdict = "-"
        elif r.regressed(gate):
            spread = "" if r.beyond(gate.metric) is not None else ", no spread known"
            moved = 100 * ((r.ratio(gate.metric) or 1.0) - 1.0)
            verdict = f"REGRESSION ({gate.metric} {moved:+.1f}%{spread})"
        else:
            verdict = "ok"
        out.append(
            (
                r.arm,
                r.cell,
                fmt(r.old.get("tok_s")),
                fmt(r.new.get("tok_s")),
                _ratio_text(r, "tok_s"),
                _ratio_text(r, "ttft_p99_ms"),
                _ratio_text(r, "tpot_p99_ms"),
                verdict,
            )
        )
    return Table(
        key="diff",
        title="Shared cells, OLD against NEW",
        columns=(
            "arm",
            "cell",
            "old tok/s",
            "new tok/s",
            "x tok/s",
            "x TTFT p99",
            "x TPOT p99",
            "gate",
        ),
        rows=out,
        caption=(
            "x: NEW / OLD. tok/s: aggregate (one request: e2e). "
            f"{NOT_A_DIFFERENCE}: within the larger run-to-run spread of the two, not a "
            "difference."
            + (f" Gate: {gate.metric} {100 * gate.change:+g}% and past the spread." if gate else "")
        ),
        align_left=2,
    )


def diff_reports(old: Path, new: Path, prices: PriceBook) -> tuple[Report, Report]:
    return (
        build_report(load_folders([old]), prices),
        build_report(load_folders([new]), prices),
    )
