"""The int4 benchmarks that only a GPU measures, checked where CI runs: the planar
layout's kernel (`benchmarks/int4_planar_h200.py`) in Triton's interpreter, the
Nsight Compute probe (`benchmarks/int4_ncu_probe.py`) refusing, in one line, a machine
with no CUDA device, the quantize memory benchmark's CPU form, and the per-layer pair
fused into one kernel (`benchmarks/ple_pair_h200.py`) in the interpreter and built for
sm_90."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _dry_run(module: str, out: Path) -> list[dict[str, Any]]:
    """A benchmark's `--dry-run` in Triton's interpreter, in its own process: its checks."""
    proc = subprocess.run(
        [sys.executable, "-m", module, "--dry-run", "--out", str(out)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        cwd=interpreter_child.ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    checks: list[dict[str, Any]] = json.loads(out.read_text())["dry_run"]
    return checks


def test_the_planar_benchmarks_dry_run_matches_dequantize_then_matmul(tmp_path: Path) -> None:
    checks = _dry_run("benchmarks.int4_planar_h200", tmp_path / "planar.json")
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


@pytest.mark.parametrize(
    ("name", "says"),
    [("w8_sk2", "not a configuration name"), ("w8_rw1_sk5_st2", "does not take w8_rw1_sk5_st2")],
)
def test_the_ncu_probe_refuses_a_cuda_build_it_cannot_run_in_one_line(name: str, says: str) -> None:
    probe = [sys.executable, "-m", "benchmarks.int4_ncu_probe", "1536", "12288", "64"]
    proc = subprocess.run(
        [*probe, "--cuda-config", name],
        cwd=interpreter_child.ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "error: --cuda-config: " in proc.stderr.strip().splitlines()[-1]
    assert says in proc.stderr
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


def test_the_fused_per_layer_pair_computes_what_the_engines_two_kernels_do(
    tmp_path: Path,
) -> None:
    checks = _dry_run("benchmarks.ple_pair_h200", tmp_path / "ple_pair.json")
    assert {c["scalar"] for c in checks} == {True, False}
    assert all(c["ok"] for c in checks), checks


def test_every_fused_pair_config_builds_for_sm90() -> None:
    from benchmarks.ple_pair_h200 import CONFIGS, builds

    built = builds()
    assert [b["config"] for b in built] == [list(c) for c in CONFIGS]
    assert all(0 < b["registers"] <= 255 for b in built)
