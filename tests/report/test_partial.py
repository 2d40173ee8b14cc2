"""A sweep cell that lost requests: its figure shown with the loss, never ranked or costed."""

from __future__ import annotations

import shutil
from pathlib import Path

from contract.results import SweepSummary
from report.prices import choose_prices
from report.write import write_report
from tests.report.handmade import Handmade
from tests.report.helpers import cell, table


def test_a_partial_cell_is_labelled_with_its_loss_and_left_out_of_rankings(
    handmade: Handmade, tmp_path: Path
):
    root = tmp_path / "results"
    shutil.copytree(handmade.root, root)
    relative = handmade.shard_dirs["g6"].relative_to(handmade.root)
    path = root / relative / "jobs" / "vllm-sweep" / "summary.json"
    summary = SweepSummary.model_validate_json(path.read_text())
    cells = []
    for c in summary.cells:
        if (c.shape, c.concurrency) == ("in512-out128", 8):
            first = c.repeats[0].model_copy(update={"requests_failed": 2})
            c = c.model_copy(
                update={
                    "status": "partial",
                    "reason": "2 request(s) failed: HTTP 500",
                    "repeats": [first, *c.repeats[1:]],
                }
            )
        cells.append(c)
    path.write_text(summary.model_copy(update={"cells": cells}).model_dump_json())

    written = write_report(
        root, tmp_path / "report", baseline="llama@g6", prices=choose_prices("table")
    )
    shown = cell(table(written, "sweep-in512-out128"), "8", "vllm")
    assert shown.startswith("partial, 2 failed: "), shown
    best = table(written, "best-in512-out128")
    assert all("vllm (" not in " ".join(r) or r[0] != "8" for r in best.rows)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "partial cells (requests failed" in text and "vllm at 8 (2 failed)" in text
    costs = [t for t in written.tables if t.key.startswith("cost")]
    assert all("vllm" not in r[0] or "8" not in r for t in costs for r in t.rows)
