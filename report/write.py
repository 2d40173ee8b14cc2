"""`write_report`: results folder in, report.md + report.html + PNG plots out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from report.build import build_report
from report.cells_csv import write_cells_csv
from report.folders import load_folders
from report.plots import Plot, draw_all
from report.prices import DEFAULT_TABLE, PriceBook, PriceMode, choose_prices
from report.rate import rate_tables
from report.render import render_html, render_markdown, sections
from report.rows import Report, Slo
from report.site_tables import cross_table, where_tables
from report.summary import summary_table
from report.tables import Table, all_tables
from report.user_tables import per_user_tables, slo_table, wait_table

__all__ = ["REPORT_HTML", "REPORT_MD", "Written", "default_out", "write_report"]

REPORT_MD = "report.md"
REPORT_HTML = "report.html"


@dataclass(frozen=True)
class Written:
    report: Report
    tables: list[Table]
    plots: list[Plot]
    markdown: Path
    html: Path
    cells_csv: Path


def default_out(results: Path) -> Path:
    return results / "report"


def write_report(
    results: Path | Sequence[Path],
    out: Path | None = None,
    *,
    baseline: str | None = None,
    prices: PriceBook | None = None,
    price_mode: PriceMode = "auto",
    price_table: Path = DEFAULT_TABLE,
    slo: Slo | None = None,
    labels: Sequence[str] | None = None,
) -> Written:
    """Read `results` (one folder, or several with their `labels`), write the report into
    `out` (default: the first folder's report/).

    Raises:
        report.load.ResultsError: not a results folder, or several campaigns.
        ValueError: an unknown baseline arm.
        report.prices.PriceError: --prices aws and AWS could not be asked.
    """
    folders = [results] if isinstance(results, Path) else list(results)
    campaign = load_folders(folders, labels)
    book = prices or choose_prices(price_mode, table=price_table)
    report = build_report(campaign, book, baseline=baseline, slo=slo)
    target = out or default_out(folders[0])
    target.mkdir(parents=True, exist_ok=True)
    tables = all_tables(report)
    headline = slo_table(report)
    tables += ([headline] if headline else []) + per_user_tables(report)
    waits = wait_table(report)
    tables += [waits] if waits else []
    summary = summary_table(report)
    tables += [summary] if summary else []
    cross = cross_table(report)
    tables += ([cross] if cross else []) + where_tables(report) + rate_tables(report.rates)
    plots = draw_all(report, target)
    # In the order the page shows them.
    tables = [t for section in sections(report, tables, plots) for t in section.tables]
    cells = write_cells_csv(report.results.arms(), target)
    markdown = target / REPORT_MD
    markdown.write_text(render_markdown(report, tables, plots))
    page = target / REPORT_HTML
    page.write_text(render_html(report, tables, plots))
    return Written(report, tables, plots, markdown, page, cells)
