"""The int4 benchmarks that only a GPU measures, checked where CI runs: the planar
layout's kernel (`benchmarks/int4_planar_h200.py`) in Triton's interpreter, the
Nsight Compute probe (`benchmarks/int4_ncu_probe.py`) refusing, in one line, a machine
with no CUDA device, and the quantize memory benchmark's CPU form."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.engines.pytorch import interpreter_child

pytest.importorskip("triton")


def test_the_planar_layout_puts_each_nibble_tile_on_sixteen_consecutive_inputs() -> None:
    from benchmarks.int4_planar_kernels import planar_pack

    q = (torch.arange(2 * 256) % 16 - 8).reshape(2, 256).to(torch.int8)
    words = planar_pack(q)
    for chunk, i, j in ((0, 0, 0), (0, 7, 15), (1, 3, 5), (1, 6, 0)):
        word = int(words[1, 16 * chunk + j]) & 0xFFFFFFFF
        assert (word >> (4 * i)) & 0xF == int(q[1, 128 * chunk + 16 * i + j]) + 8


def test_the_planar_benchmarks_dry_run_matches_dequantize_then_matmul(tmp_path: Path) -> None:
    out = tmp_path / "planar.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.int4_planar_h200", "--dry-run", "--out", str(out)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        cwd=interpreter_child.ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = json.loads(out.read_text())["dry_run"]
    assert len(checks) == 5 and all(c["max_err_over_max"] < 2e-3 for c in checks), checks
    assert any(len(c["config"]) > 3 and c["config"][2] > 1 for c in checks), "a split-K tile"
    assert [c["config"] for c in checks if len(c["config"]) == 3] == [[8, 1024, 4], [16, 256, 2]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU-only machine")
def test_the_ncu_probe_says_in_one_line_that_it_needs_a_gpu() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.int4_ncu_probe", "1536", "12288", "64"],
        cwd=interpreter_child.ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("error: needs a CUDA device")
    assert "Traceback" not in proc.stderr


def test_the_planar_kernel_feeds_the_tensor_cores_without_a_shared_memory_round_trip(
    tmp_path: Path,
) -> None:
    """Built for sm_90 with no GPU: the planar tiles reach wgmma with no shared-memory
    stores in the loop, where every shipped 64-row entry stores its tile (`STS`)."""
    out = tmp_path / "sass.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.int4_planar_h200", "--sass", "--out", str(out)],
        cwd=interpreter_child.ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    mixes = json.loads(out.read_text())["sass"]
    planar = [m for m in mixes if m["kernel"] == "planar"]
    shipped = [m for m in mixes if m["kernel"] == "matmul_int4"]
    assert len(planar) == 2 and len(shipped) == 6, mixes
    assert all(m["STS"] == 0 and m["HGMMA"] == 8 for m in planar), planar
    assert all(m["STS"] > 0 for m in shipped), shipped
    one_row = {m["kernel"] for m in mixes if m["name"] == "o sliding, 1 row"}
    assert one_row == {"gemv_int4", "planar_gemv"}, mixes


def test_the_quantize_memory_benchmark_runs_both_passes_on_the_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.int4_quantize_memory", "--device", "cpu",
         "--rows", "64", "--cols", "256"],
        cwd=interpreter_child.ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = [line.split(" | ")[0] for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert table[2:] == ["| by rows (shipped)", "| whole weight"]
