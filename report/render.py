"""report.md and a self-contained report.html from the tables and plots.

Both documents have the same sections in the same order. The Markdown links the PNGs beside
it; the HTML carries them inline as data: URIs (one file to mail or archive), with a small
print-friendly stylesheet. Every piece of result text is HTML-escaped: arm names, reasons
and server errors come from the results folder.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from report.plots import Plot
from report.rows import Report
from report.tables import Table

__all__ = ["Section", "render_html", "render_markdown", "sections"]


@dataclass(frozen=True)
class Section:
    title: str
    paragraphs: list[str]
    bullets: list[str]
    tables: list[Table]
    plots: list[Plot]


def _pick(tables: Sequence[Table], prefix: str) -> list[Table]:
    return [t for t in tables if t.key == prefix or t.key.startswith(prefix + "-")]


def _plots(plots: Sequence[Plot], prefix: str) -> list[Plot]:
    return [p for p in plots if p.key.startswith(prefix)]


def sections(report: Report, tables: Sequence[Table], plots: Sequence[Plot]) -> list[Section]:
    out = [
        Section(
            "Scope",
            [
                "What was measured, where and when, as the seeds state it. Numbers come "
                f"with their n and run-to-run spread; ratios are to the baseline arm "
                f"{report.baseline}."
            ],
            report.scope,
            [],
            [],
        ),
        Section("Compare and contrast", [], [], _pick(tables, "summary"), []),
        Section(
            "What to run where",
            [],
            [],
            _pick(tables, "where") + _pick(tables, "cross"),
            [],
        ),
        Section("One request", [], [], _pick(tables, "probe"), []),
        Section("Drafter", [], [], _pick(tables, "drafter"), []),
        Section(
            "Load sweep",
            []
            if _pick(tables, "sweep") or not _pick(tables, "rate")
            else ["No sweep by concurrency level ran: the rate-mode cells follow."],
            [],
            _pick(tables, "sweep"),
            _plots(plots, "throughput") + _plots(plots, "ttft"),
        ),
        *(
            [Section("Latency against request rate", [], [], rates, _plots(plots, "rate-"))]
            if (rates := _pick(tables, "rate"))
            else []
        ),
        Section(
            "Per-user speed and the SLO",
            [],
            [],
            _pick(tables, "slo") + _pick(tables, "user") + _pick(tables, "server"),
            _plots(plots, "pareto") + _plots(plots, "server"),
        ),
        Section("Best per level", [], [], _pick(tables, "best"), []),
        Section(
            "Accuracy",
            [] if report.accuracy else ["No accuracy eval ran in this campaign."],
            [],
            _pick(tables, "accuracy") + _pick(tables, "gsm8k-time"),
            _plots(plots, "gsm8k-time"),
        ),
        Section(
            "Cost",
            []
            if _pick(tables, "cost")
            else ["No price applies: every shard ran on a local machine, not an instance."],
            report.price_notes,
            _pick(tables, "cost"),
            [],
        ),
        Section(
            "Energy and telemetry",
            []
            if report.gpu_sampled
            else ["No GPU was sampled, so there is no energy figure; host telemetry is plotted."],
            [],
            _pick(tables, "energy"),
            _plots(plots, "telemetry"),
        ),
        Section("What was not measured, and caveats", [], report.not_measured, [], []),
    ]
    if report.problems:
        out.append(Section("Problems reading the results", [], report.problems, [], []))
    return out


def _sources(report: Report) -> str:
    folders = report.results.folders
    if not folders:
        return str(report.results.root)
    return ", ".join(f"{path} (as @{label})" for label, path in folders)


def _header(report: Report) -> tuple[str, str]:
    title = f"Serving benchmark report: {report.campaign}"
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    sub = (
        (report.description + ". " if report.description else "")
        + f"Generated {made} by `bench report` from {_sources(report)}; "
        f"arms: {', '.join(report.arms)}."
    )
    return title, sub


# --- Markdown ---------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(table: Table) -> list[str]:
    lines = [f"**{_md_cell(table.title)}**", ""]
    lines.append("| " + " | ".join(_md_cell(c) for c in table.columns) + " |")
    lines.append(
        "|"
        + "|".join("---" if i < table.align_left else "---:" for i in range(len(table.columns)))
        + "|"
    )
    for row in table.rows:
        lines.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    if table.caption:
        lines += ["", f"*{table.caption}*"]
    for note in table.notes:
        lines += ["", note]
    return [*lines, ""]


def render_markdown(report: Report, tables: Sequence[Table], plots: Sequence[Plot]) -> str:
    title, sub = _header(report)
    lines = [f"# {title}", "", sub, ""]
    for section in sections(report, tables, plots):
        lines += [f"## {section.title}", ""]
        for paragraph in section.paragraphs:
            lines += [paragraph, ""]
        if section.bullets:
            # Lines indented by two spaces (an engine under its shard) are nested bullets.
            lines += [
                f"  - {b.strip()}" if b.startswith("  ") else f"- {b}" for b in section.bullets
            ]
            lines += [""]
        for table in section.tables:
            lines += _md_table(table)
        for plot in section.plots:
            lines += [f"![{plot.title}]({plot.path.name})", "", f"*{plot.caption}*", ""]
    return "\n".join(lines).rstrip() + "\n"


# --- HTML -------------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif, "Apple Color Emoji",
       "Segoe UI Emoji", "Noto Color Emoji"; color: #111; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; }
div.wide { overflow-x: auto; } td.status { color: #8a1c1c; font-style: italic; }
ul.scope li.sub { list-style: circle; margin-left: 1.5em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.8em 0 0.3em; font-variant-numeric: tabular-nums; }
caption { caption-side: top; text-align: left; font-weight: 600; padding-bottom: 0.3em; }
th, td { border: 1px solid #bbb; padding: 3px 8px; vertical-align: top; }
th { background: #eee; } td.num { text-align: right; white-space: nowrap; }
td.muted { color: #999; background: #f3f3f3; }
p.caption, figcaption { color: #444; font-size: 0.9em; max-width: 70em; }
figure { margin: 1em 0; } img { max-width: 100%; height: auto; border: 1px solid #ddd; }
ul.scope li { margin: 0.15em 0; white-space: pre-wrap; }
@media print { body { max-width: none; margin: 0; } h2 { break-after: avoid; }
               table, figure { break-inside: avoid; } }
"""


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _status_row(row: Sequence[str], align_left: int) -> bool:
    """A row with no figures, only a status in its first value column ('failed: ...')."""
    rest = row[align_left + 1 :]
    value = row[align_left] if len(row) > align_left else ""
    return bool(rest) and all(c == "-" for c in rest) and value[:1].isalpha()


def _html_table(table: Table) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in table.columns)
    body = []
    left = table.align_left
    for r, row in enumerate(table.rows):
        if _status_row(row, left):
            # One cell across the figures: a failure's reason must not widen a number column.
            cells = "".join(f"<td>{_e(c)}</td>" for c in row[:left])
            cells += f'<td class="status" colspan="{len(row) - left}">{_e(row[left])}</td>'
        else:
            cells = "".join(
                f"<td>{_e(c)}</td>"
                if i < left
                else f'<td class="num{" muted" if (r, i) in table.muted else ""}">{_e(c)}</td>'
                for i, c in enumerate(row)
            )
        body.append(f"<tr>{cells}</tr>")
    parts = [
        f'<div class="wide"><table id="{_e(table.key)}"><caption>{_e(table.title)}</caption>',
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>",
    ]
    if table.caption:
        parts.append(f'<p class="caption">{_e(table.caption)}</p>')
    parts += [f"<p>{_e(n)}</p>" for n in table.notes]
    return "\n".join(parts)


def _html_plot(plot: Plot) -> str:
    data = base64.b64encode(plot.path.read_bytes()).decode("ascii")
    return (
        f'<figure id="{_e(plot.key)}"><img alt="{_e(plot.title)}" '
        f'src="data:image/png;base64,{data}"><figcaption>{_e(plot.caption)}</figcaption></figure>'
    )


def render_html(report: Report, tables: Sequence[Table], plots: Sequence[Plot]) -> str:
    title, sub = _header(report)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<p>{_e(sub.replace('`', ''))}</p>",
    ]
    for section in sections(report, tables, plots):
        parts.append(f"<h2>{_e(section.title)}</h2>")
        parts += [f"<p>{_e(p)}</p>" for p in section.paragraphs]
        if section.bullets:
            items = "".join(
                f'<li class="sub">{_e(b.strip())}</li>'
                if b.startswith("  ")
                else f"<li>{_e(b)}</li>"
                for b in section.bullets
            )
            parts.append(f'<ul class="scope">{items}</ul>')
        parts += [_html_table(t) for t in section.tables]
        parts += [_html_plot(p) for p in section.plots]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
