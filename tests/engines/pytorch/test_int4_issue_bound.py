"""`benchmarks/int4_issue_bound.py` on one 64-row entry of the pinned table, with no GPU:
its sm_90 build's main loop found in the SASS, and bounds that add up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines.pytorch import interpreter_child

pytest.importorskip("triton")


def test_the_issue_bound_benchmark_reads_a_pinned_entrys_build(tmp_path: Path) -> None:
    """q/k/v of a sliding layer (12 a step): a loop of wgmma groups, and the SMs issue it
    in more time than its bytes take, both far below what the H200 measured (8.5 us)."""
    out = tmp_path / "bound.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.int4_issue_bound", "--only", "2560,1536",
         "--out", str(out)],
        cwd=interpreter_child.ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (bound,) = json.loads(out.read_text())["bounds"]
    assert bound["loop_instructions"] > 100 and bound["in_flight"] is not None, bound
    assert bound["per_step"] == 12 and bound["chunks"] * bound["programs"] > 0, bound
    assert 0 < bound["bytes_us"] < bound["issue_us"] < 10, bound
    assert 32 <= bound["registers"] <= 255 and bound["shared_bytes"] > 0, bound
    assert "| 2560 x 1536 |" in proc.stdout
