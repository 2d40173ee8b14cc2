"""`benchmarks/decode_residency.py` with no GPU: the kernels of E2B's two commonest layers
in launch order, built for sm_90 at the pinned table's entries, with what each holds on
an SM; and the room model on a hand-made pair of kernels."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines.pytorch import interpreter_child

pytest.importorskip("triton")


def test_the_residency_benchmark_lists_each_layers_kernels_in_launch_order(
    tmp_path: Path,
) -> None:
    out = tmp_path / "residency.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.decode_residency", "--out", str(out)],
        cwd=interpreter_child.ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    layers = json.loads(out.read_text())
    assert len(layers) == 2
    for rows in layers.values():
        names = [row["name"] for row in rows]
        assert names[1:] == ["attention partial", "attention combine", "o", "gate/up", "down",
                             "per-layer gate", "per-layer projection"]  # fmt: skip
        for row in rows:
            assert 0 < row["registers"] <= 255 and 1 <= row["an_sm"] <= 64 // row["warps"], row
            # The shipped batch-1 kernels keep their values in registers: at most one
            # spilled (the per-layer projection stores and loads one register once).
            assert row["stack_bytes"] <= 8, row
            assert 0 <= row["beside_previous"] <= row["programs"], row
        # Every product waits on the kernel before it, then moves data between its warps.
        assert all(row["barriers_after_wait"] > 0 for row in rows if "attention" not in row["name"])
        assert all(row["instructions_after_wait"] > 100 for row in rows), rows
        # Each kernel reads its input row after the wait, the products' in wide loads (a
        # few narrow ones: the scales).
        assert all(row["loads_after_wait"] > 0 for row in rows), rows
        products = [row for row in rows if "attention" not in row["name"]]
        assert all(row["narrow_loads_after_wait"] <= 12 for row in products), products
    assert "| per-layer gate |" in proc.stdout


def test_room_counts_the_programs_that_fit_beside_the_kernel_before() -> None:
    from benchmarks.decode_residency import SMS, Residency, with_room

    def kernel(programs: int, warps: int, registers: int, shared: int = 0) -> Residency:
        return Residency("k", "", programs, warps, registers, shared, 64 // warps, 0, 0, 0, 0)

    # 264 programs of 8 warps at 128 registers fill every SM's registers: nothing fits.
    full, small = kernel(264, 8, 128), kernel(32, 4, 96)
    assert with_room([full, small])[1].beside_previous == 0
    # 132 of them fill half of each SM: 2 programs of 4 warps at 96 registers (12,288
    # registers each) fit beside on every SM.
    half = kernel(SMS, 8, 128)
    assert with_room([half, kernel(1000, 4, 96)])[1].beside_previous == 2 * SMS
    # Shared memory limits too: 200 KB beside leaves room for no 40 KB program.
    shared = with_room([kernel(SMS, 4, 32, 200 * 1024), kernel(32, 4, 32, 40 * 1024)])
    assert shared[1].beside_previous == 0
