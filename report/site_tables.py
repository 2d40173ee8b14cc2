"""Tables across GPUs: each arm against its own run on the first GPU (seed 001's layout), and
what to run where, per GPU and overall. Formatting only: the rows are `report.sites`'."""

from __future__ import annotations

from report.rows import Pick, Report
from report.tables import NOT_A_DIFFERENCE, Table, fmt

__all__ = ["cross_table", "where_tables"]


def _ratio(value: float | None, differs: bool | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" + (f" {NOT_A_DIFFERENCE}" if differs is False else "")


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.2f}" if value >= 0.1 else f"${value:.3g}"


def cross_table(report: Report) -> Table | None:
    if not report.cross:
        return None
    first = report.cross[0]
    items = list(dict.fromkeys(item for r in report.cross for item in r.evals))
    titles = {"gsm8k": "GSM8K", "bfcl": "BFCL"}
    rows = []
    for r in report.cross:
        reference = r.site == r.reference
        load = (
            fmt(r.load_tok_s)
            if r.load_tok_s is not None
            else (r.load_status if r.load_level is not None else "-")
        )
        rows.append(
            (
                r.arm,
                r.site,
                fmt(r.one_tok_s),
                "reference" if reference else _ratio(r.one_ratio, r.one_differs),
                load,
                "reference" if reference else _ratio(r.load_ratio, r.load_differs),
                *(r.evals.get(item, "-") for item in items),
            )
        )
    level = first.load_level
    return Table(
        key="cross-gpu",
        title=f"Across GPUs: each arm against its own run on {first.reference}",
        columns=(
            "arm",
            "GPU",
            "one request e2e tok/s",
            "x ref, 1 request",
            f"{first.load_shape} at {level} tok/s" if level else "top load tok/s",
            "x ref, load",
            *(f"{titles.get(i, i)} (paired with the reference)" for i in items),
        ),
        rows=rows,
        caption=(
            "Seed 001's layout: the same arm on each GPU against its run on the first. "
            f"{NOT_A_DIFFERENCE}: the ratio is within the run-to-run spread of either run "
            "(not a difference). Top load: the highest level of the first shape, complete "
            "cells only. Accuracy: the score, then the paired test against the reference "
            "run question by question ('level' when the 95% interval of the difference "
            "contains zero)."
        ),
        align_left=2,
    )


def _pick(pick: Pick | None, *, price: bool = True) -> str:
    if pick is None:
        return "-"
    text = f"{pick.label}: {fmt(pick.tok_s)} tok/s"
    if pick.level is not None:
        text += f" at {pick.level}"
    if price and pick.usd_per_m is not None:
        text += f", {_usd(pick.usd_per_m)}/M"
    return text


def where_tables(report: Report) -> list[Table]:
    if not report.site_best:
        return []
    per_site = Table(
        key="where-sites",
        title="What to run where: the best arm on each GPU",
        columns=("GPU", "shape", "1 request (e2e)", "highest load", "under the SLO"),
        rows=[
            (
                r.site,
                r.shape or "-",
                _pick(r.one_request, price=False),
                _pick(r.top_load),
                _pick(r.under_slo) if report.slo.given else "no SLO given",
            )
            for r in report.site_best
        ],
        caption=(
            "Per GPU: the fastest arm at one request; at the highest level it measured, the "
            "arm with the most aggregate tok/s; under the SLO "
            f"({report.slo.describe()}), the cell with the most aggregate tok/s that meets "
            "it. $/M: output tokens at that GPU's on-demand price. Complete cells only."
        ),
        align_left=2,
    )
    overall = Table(
        key="where-overall",
        title="What to run where: the recommendation per use case",
        columns=("use case", "run", "on", "shape", "because"),
        rows=[
            (
                u.use,
                _pick(u.pick),
                u.site or "-",
                (u.pick.shape or "-") if u.pick else "-",
                u.why,
            )
            for u in report.use_cases
        ],
        caption=(
            "From the per-GPU table: a recommendation is only as good as the cells measured; "
            "check the spread marks in the tables above before buying."
        ),
        align_left=5,
    )
    return [per_site, overall]
