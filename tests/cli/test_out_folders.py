"""`--out` reused: refused, resumed or overwritten as asked, never mixed (real `bench`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.results import RequestRecord, SweepSummary
from refserver.harness import ReferenceServer, reference_server

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = str(Path(sys.executable).with_name("bench"))
FLAGS = ["--shapes", "64/8", "--levels", "1,2", "--repeats", "1", "--no-warmup"]


@pytest.fixture(scope="module")
def server() -> Iterator[ReferenceServer]:
    with reference_server(ttft_ms=2, itl_ms=1) as srv:
        yield srv


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BENCH, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200"},
        check=False,
    )


def request_ids(out: Path, name: str = "requests.jsonl") -> list[str]:
    lines = (out / name).read_text().splitlines()
    return [RequestRecord.model_validate_json(line).request_id for line in lines]


def test_a_folder_with_results_is_refused_with_one_line(server: ReferenceServer, tmp_path: Path):
    out = tmp_path / "s"
    assert bench("sweep", server.url, *FLAGS, "--out", str(out)).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for command in (["sweep", *FLAGS], ["probe", "--repeats", "1"]):
        result = bench(command[0], server.url, *command[1:], "--out", str(out))
        assert result.returncode == 2
        assert result.stderr.strip().count("\n") == 0
        assert "already holds results" in result.stderr and "--resume" in result.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_overwrite_moves_the_old_run_aside_and_never_deletes(
    server: ReferenceServer, tmp_path: Path
):
    out = tmp_path / "s"
    assert bench("sweep", server.url, *FLAGS, "--out", str(out)).returncode == 0
    old = request_ids(out)
    result = bench("sweep", server.url, *FLAGS, "--out", str(out), "--overwrite")
    assert result.returncode == 0, result.stderr
    (aside,) = tmp_path.glob("s.replaced-*")
    assert request_ids(aside) == old
    new = request_ids(out)
    assert len(new) == len(set(new)) == len(old)


def test_resume_finishes_an_interrupted_sweep_without_mixing(
    server: ReferenceServer, tmp_path: Path
):
    out = tmp_path / "s"
    assert bench("sweep", server.url, *FLAGS, "--out", str(out)).returncode == 0
    # What a crash while the second cell was measured leaves: its records on disk, the
    # summary written after the first cell only.
    summary = json.loads((out / "summary.json").read_text())
    first_cell = summary["cells"][0]
    summary.update(cells=[first_cell], finished_unix_s=None)
    (out / "summary.json").write_text(json.dumps(summary))
    first_ids = [i for i in request_ids(out) if i.startswith("in64-out8/c1/")]
    interrupted = [i for i in request_ids(out) if i.startswith("in64-out8/c2/")]

    other = bench("sweep", server.url, *FLAGS[:-1], "--out", str(out), "--resume")
    assert other.returncode == 2 and "other settings" in other.stderr

    result = bench("sweep", server.url, *FLAGS, "--out", str(out), "--resume")
    assert result.returncode == 0, result.stderr
    done = SweepSummary.model_validate_json((out / "summary.json").read_text())
    assert done.finished_unix_s is not None
    assert [(c.concurrency, c.status) for c in done.cells] == [(1, "ok"), (2, "ok")]
    assert done.cells[0] == SweepSummary.model_validate(summary).cells[0], "kept as it was"
    ids = request_ids(out)
    assert len(ids) == len(set(ids)), "no request twice"
    assert [i for i in ids if i.startswith("in64-out8/c1/")] == first_ids
    assert request_ids(out, "requests.interrupted.jsonl") == interrupted


def test_resume_needs_results(server: ReferenceServer, tmp_path: Path):
    result = bench("sweep", server.url, *FLAGS, "--out", str(tmp_path / "none"), "--resume")
    assert result.returncode == 2 and "holds no results" in result.stderr


@pytest.mark.parametrize("shapes", ["64/0", "", "abc"])
def test_bad_shapes_are_one_line(server: ReferenceServer, tmp_path: Path, shapes: str):
    result = bench("sweep", server.url, "--shapes", shapes, "--out", str(tmp_path / "x"))
    assert result.returncode == 2
    assert result.stderr.startswith("bench sweep: --shapes") and "http" not in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert not (tmp_path / "x").exists()


def test_a_gpu_spec_is_refused_up_front_on_a_host_without_one(tmp_path: Path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    spec = REPO_ROOT / "agent" / "campaigns" / "t4-six-engines.toml"
    result = bench("run", str(spec), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after the GPU probe's log line
    assert last.startswith("bench run: ") and "need an NVIDIA GPU" in last and "vllm" in last
    assert not (tmp_path / "out").exists()


def test_a_401_hints_at_the_api_key(server: ReferenceServer, tmp_path: Path):
    from tests.fixtures.fault_proxy import fault_proxy

    with fault_proxy(server.port, mode="unauthorized") as proxy:
        result = bench("sweep", proxy.url, *FLAGS, "--out", str(tmp_path / "x"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "HTTP 401" in result.stderr and "BENCH_API_KEY" in result.stderr
    assert not (tmp_path / "x").exists()
