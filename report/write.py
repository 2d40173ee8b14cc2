"""`write_report`: results folder in, report.md + report.html + PNG plots out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from report.build import build_report
from report.load import load_campaign_results
from report.plots import Plot, draw_all
from report.prices import DEFAULT_TABLE, PriceBook, PriceMode, choose_prices
from report.render import render_html, render_markdown, sections
from report.rows import Report, Slo
from report.tables import Table, all_tables
from report.user_tables import per_user_tables, slo_table

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


def default_out(results: Path) -> Path:
    return results / "report"


def write_report(
    results: Path,
    out: Path | None = None,
    *,
    baseline: str | None = None,
    prices: PriceBook | None = None,
    price_mode: PriceMode = "auto",
    price_table: Path = DEFAULT_TABLE,
    slo: Slo | None = None,
) -> Written:
    """Read `results`, write the report into `out` (default: `results`/report).

    Raises:
        report.load.ResultsError: not a results folder, or several campaigns.
        ValueError: an unknown baseline arm.
        report.prices.PriceError: --prices aws and AWS could not be asked.
    """
    campaign = load_campaign_results(results)
    book = prices or choose_prices(price_mode, table=price_table)
    report = build_report(campaign, book, baseline=baseline, slo=slo)
    target = out or default_out(results)
    target.mkdir(parents=True, exist_ok=True)
    tables = all_tables(report)
    headline = slo_table(report)
    tables += ([headline] if headline else []) + per_user_tables(report)
    plots = draw_all(report, target)
    # In the order the page shows them.
    tables = [t for section in sections(report, tables, plots) for t in section.tables]
    markdown = target / REPORT_MD
    markdown.write_text(render_markdown(report, tables, plots))
    page = target / REPORT_HTML
    page.write_text(render_html(report, tables, plots))
    return Written(report, tables, plots, markdown, page)
