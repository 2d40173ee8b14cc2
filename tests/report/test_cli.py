"""`bench report` as a user runs it: a subprocess, the headline table on stdout, files written,
one-line errors with exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.report.handmade import Handmade

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    # No AWS credentials may leak in: --prices auto must take the table here.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return env | {
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "COLUMNS": "200",
    }


def _bench(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=_env(),
        check=False,
    )


def test_bench_report_writes_the_files_and_prints_the_headline(handmade: Handmade, tmp_path: Path):
    out = tmp_path / "out"
    result = _bench("report", str(handmade.root), "--out", str(out), "--baseline", "llama@g6")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "One request" in result.stdout
    for arm in ("llama@g6", "vllm-d4", "sglang", "mistralrs", "llama@t4spot"):
        assert arm in result.stdout
    assert "not run" in result.stdout and "failed" in result.stdout
    assert "report/prices.toml" in result.stdout  # which prices were used, said
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    assert len(list(out.glob("*.png"))) == 11  # 7 of the seeds, 4 Pareto views
    assert (out / "cells.csv").is_file()


def test_bench_report_errors_are_one_line_with_status_2(handmade: Handmade, tmp_path: Path):
    result = _bench("report", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("bench report: ")
    assert "no manifest.json" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = _bench("report", str(handmade.root), "--out", str(tmp_path / "x"), "--baseline", "x")
    assert result.returncode == 2
    assert "--baseline 'x' is not an arm here" in result.stderr
    assert "llama@g6" in result.stderr


def test_the_report_package_is_installed_with_the_project(tmp_path: Path):
    """`bench report` from any folder needs `report` in pyproject's package list."""
    result = subprocess.run(
        [sys.executable, "-c", "import report.write"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=_env() | {"PYTHONPATH": ""},
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            "the report package is not installed: add 'report*' to "
            "[tool.setuptools.packages.find] include in pyproject.toml"
        )
