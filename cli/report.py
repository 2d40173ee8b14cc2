"""`bench report DIR`: write report.md, report.html and plots; print the headline table.

The flags are declared in cli/main.py (so `bench --help` stays instant); this module, and
matplotlib with it, is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table as RichTable

from cli.standalone_report import standalone_view
from report.prices import DEFAULT_TABLE, PriceError
from report.tables import Table, probe_table
from report.write import write_report

__all__ = ["run_report"]


def _rich(table: Table) -> RichTable:
    out = RichTable(title=table.title)
    for i, column in enumerate(table.columns):
        out.add_column(column, justify="left" if i < table.align_left else "right")
    for row in table.rows:
        out.add_row(*row)
    return out


def run_report(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-report-") as scratch:
        # Standalone probe/sweep/eval folders are read through a campaign-shaped view.
        view = standalone_view(args.dir, Path(scratch))
        if view is not None:
            args.out = args.out or args.dir / "report"
        return _run_report(args, view or args.dir)


def _run_report(args: argparse.Namespace, results: Path) -> int:
    try:
        written = write_report(
            results,
            args.out,
            baseline=args.baseline,
            price_mode=args.prices,
            price_table=args.price_table or DEFAULT_TABLE,
        )
    except PriceError as exc:
        print(f"bench report: {exc}", file=sys.stderr)
        return 2
    console = Console()
    console.print(_rich(probe_table(written.report)))
    for note in written.report.price_notes:
        console.print(note, style="dim", markup=False)
    console.print(f"report: {written.markdown}", markup=False)
    console.print(f"        {written.html} and {len(written.plots)} PNG plots", markup=False)
    return 0
