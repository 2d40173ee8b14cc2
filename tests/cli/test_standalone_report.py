"""Standalone folders are reportable: `bench probe`, `bench sweep` and `bench eval` each write
standalone.json, and `bench report` renders one folder or a folder of them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from contract.standalone import STANDALONE_FILE, StandaloneManifest
from refserver.harness import reference_server
from tests.agent.evals.conftest import GSM8K_FIXTURE, Response, chat_response, scripted_server

REPO_ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO_ROOT)},
    )


def test_probe_sweep_and_eval_folders_render_as_one_report(tmp_path: Path) -> None:
    with reference_server(ttft_ms=2, itl_ms=1) as server:
        probe = bench(
            "probe", server.url, "--output-tokens", "8", "--repeats", "1", "--at-once", "2",
            "--out", str(tmp_path / "probe"),
        )  # fmt: skip
        sweep = bench(
            "sweep", server.url, "--shapes", "40/4", "--levels", "1,2", "--repeats", "1",
            "--out", str(tmp_path / "sweep"),
        )  # fmt: skip
    assert probe.returncode == 0 and sweep.returncode == 0, probe.stderr + sweep.stderr

    def respond(body: dict[str, Any]) -> Response:
        return chat_response("#### 18")

    with scripted_server(respond) as replay:
        evaluated = bench(
            "eval", "gsm8k", replay.url, "--data", str(GSM8K_FIXTURE),
            "--out", str(tmp_path / "eval"),
        )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr

    manifest = StandaloneManifest.model_validate_json(
        (tmp_path / "sweep" / STANDALONE_FILE).read_bytes()
    )
    assert manifest.kind == "sweep" and manifest.models == ["reference-model"]
    assert manifest.settings["levels"] == [1, 2] and manifest.host.cpus >= 1

    one = bench("report", str(tmp_path / "sweep"), "--prices", "table")
    assert one.returncode == 0, one.stderr
    text = (tmp_path / "sweep" / "report" / "report.md").read_text()
    assert "## Load sweep" in text and "reference-model" in text

    every = bench("report", str(tmp_path), "--prices", "table")
    assert every.returncode == 0, every.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## One request" in text and "## Load sweep" in text
    assert "reference-model" in text and "scripted" in text  # two servers, two arms
    assert "No accuracy eval ran" not in text and "GSM8K" in text
