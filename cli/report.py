"""`bench report DIR`: write report.md, report.html and plots; print the headline table.

The flags are declared in cli/parser.py (so `bench --help` stays instant); this module, and
matplotlib with it, is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from cli.standalone_report import standalone_view
from report.console import to_rich
from report.diff import (
    Gate,
    diff_reports,
    diff_rows,
    diff_table,
    greedy_text_lines,
    parse_gate,
)
from report.prices import DEFAULT_TABLE, PriceError, choose_prices
from report.rows import Slo
from report.tables import probe_table
from report.write import write_report

__all__ = ["run_diff", "run_report"]


def run_report(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-report-") as scratch:
        # Standalone probe/sweep/eval folders are read through a campaign-shaped view.
        views = [standalone_view(d, Path(scratch) / str(i)) for i, d in enumerate(args.dirs)]
        if views[0] is not None:
            args.out = args.out or args.dirs[0] / "report"
        return _run_report(args, [v or d for v, d in zip(views, args.dirs, strict=True)])


def _run_report(args: argparse.Namespace, results: list[Path]) -> int:
    try:
        written = write_report(
            results,
            args.out,
            baseline=args.baseline,
            price_mode=args.prices,
            price_table=args.price_table or DEFAULT_TABLE,
            slo=Slo(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms, e2el_ms=args.slo_e2el_ms),
            labels=args.label,
        )
    except PriceError as exc:
        print(f"bench report: {exc}", file=sys.stderr)
        return 2
    console = Console()
    console.print(to_rich(probe_table(written.report)))
    for table in written.tables:
        if table.key in ("slo", "where-overall"):
            console.print(to_rich(table))
    for note in written.report.price_notes:
        console.print(note, style="dim", markup=False)
    console.print(f"report: {written.markdown}", markup=False)
    console.print(f"        {written.html} and {len(written.plots)} PNG plots", markup=False)
    return 0


def run_diff(args: argparse.Namespace) -> int:
    """0: no gated regression; 1: at least one; 2: bad input (raised, printed by main)."""
    gates = [parse_gate(text) for text in args.fail_on]
    old, new = diff_reports(args.old, args.new, choose_prices("table"))
    rows, only = diff_rows(old, new)
    console = Console()
    if not rows:
        print(f"bench diff: {args.old} and {args.new} share no cell", file=sys.stderr)
        return 2
    shown: list[Gate | None] = list(gates) or [None]
    for gate in shown:
        console.print(to_rich(diff_table(rows, gate)))
    for line in only:
        console.print(line, style="dim", markup=False)
    for line in greedy_text_lines(old, new):
        console.print(line, markup=False)
    failing = [(r, g) for g in gates for r in rows if r.regressed(g)]
    for row, gate in failing:
        console.print(
            f"regression: {row.arm} {row.cell}: {gate.metric} x{row.ratio(gate.metric):.3f}",
            markup=False,
        )
    return 1 if failing else 0
