"""The `bench` console script, run as a real subprocess."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.parser import build_parser as _build_parser
from refserver import ReferenceServer, reference_server

BENCH = str(Path(sys.executable).with_name("bench"))


def bench(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BENCH, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "COLUMNS": "120"},
    )


@pytest.fixture(scope="module")
def server():
    with reference_server(ttft_ms=2, itl_ms=1) as srv:
        yield srv


def test_help_documents_every_flag_of_every_command():
    parser = _build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"bench {name} {action.option_strings or action.dest}"
    result = bench("--help")
    assert result.returncode == 0 and "probe" in result.stdout and "sweep" in result.stdout
    for name in subparsers.choices:
        assert bench(name, "--help").returncode == 0


def test_probe_prints_the_table_and_writes_results(server: ReferenceServer, tmp_path: Path):
    result = bench(
        "probe", server.url, "--output-tokens", "16", "--repeats", "2", "--out", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert "e2e tok/s" in result.stdout and "6/6" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["kind"] == "probe" and summary["repeat_identical"] == 6
    assert summary["at_once_x_one"] > 1.5
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 6 * 2 + 4


def test_sweep_prints_a_table_per_shape(server: ReferenceServer, tmp_path: Path):
    result = bench(
        "sweep",
        server.url,
        "--shapes",
        "64/8,32/16",
        "--levels",
        "1,2",
        "--repeats",
        "1",
        "--out",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert "in64-out8" in result.stdout and "in32-out16" in result.stdout
    assert "4 measured / 0 partial / 0 failed / 0 infeasible" in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "http://127.0.0.1:9"], "cannot reach http://127.0.0.1:9"),
        (["probe", "127.0.0.1:9"], "needs a scheme"),
        (["sweep", "http://127.0.0.1:9", "--shapes", "512x128"], "--shapes: shape '512x128'"),
        (["sweep", "http://127.0.0.1:9", "--levels", "0,2"], "levels"),
        (["sweep", "http://127.0.0.1:9", "--repeats", "0"], "repeats"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str, tmp_path: Path):
    result = bench(*args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]


def test_a_killed_sweep_keeps_what_it_measured(server: ReferenceServer, tmp_path: Path):
    proc = subprocess.Popen(
        [
            BENCH,
            "sweep",
            server.url,
            "--shapes",
            "64/64",
            "--levels",
            "1,2,4,8,16,32,64",
            "--repeats",
            "5",
            "--out",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    summary_path = tmp_path / "summary.json"
    deadline = time.monotonic() + 60
    cells = 0
    while time.monotonic() < deadline and cells < 2:
        time.sleep(0.1)
        if summary_path.exists():
            cells = len(json.loads(summary_path.read_text())["cells"])
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert cells >= 2, "the summary is rewritten after every cell"
    summary = json.loads(summary_path.read_text())
    assert summary["finished_unix_s"] is None
    measured = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    done = {(c["shape"], c["concurrency"]) for c in summary["cells"]}
    for shape, level in done:
        assert sum(1 for r in measured if r["label"].startswith(f"{shape}/c{level}/r")) == 5 * level


def test_a_full_disk_is_one_clear_line_and_keeps_what_was_written(
    server: ReferenceServer, tmp_path: Path
):
    """RLIMIT_FSIZE stands in for a full disk: writes past it fail with EFBIG, as ENOSPC would."""
    import resource

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))

    result = subprocess.run(
        [
            BENCH,
            "sweep",
            server.url,
            "--shapes",
            "64/32",
            "--levels",
            "1,2,4,8",
            "--repeats",
            "3",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=small_disk,
    )
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("bench sweep: cannot write") and "File too large" in last
    kept = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert kept and all(line.startswith("{") for line in kept[:-1])
