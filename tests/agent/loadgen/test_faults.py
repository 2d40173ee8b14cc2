"""`bench sweep` (a real subprocess) against servers that fail: the sweep always ends.

A fault proxy in front of the reference server injects HTTP faults; real engines (llama.cpp,
our PyTorch engine) are killed mid-sweep. For each: the sweep completes with a finished
`summary.json` holding every cell, every injected fault is a failed record matched by its
X-Request-Id, no cell that lost a request is `ok`, what was measured before is kept, and
the exit status says a failure happened.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.supervisor import EngineServer, free_port
from contract.results import RequestRecord, SweepSummary
from refserver.harness import ReferenceServer, reference_server
from tests.fixtures.fault_proxy import fault_proxy
from tests.fixtures.llama_server import llama_server_argv

REPO_ROOT = Path(__file__).resolve().parents[3]
BENCH = str(Path(sys.executable).with_name("bench"))
SWEEP_FLAGS = ["--shapes", "64/8", "--levels", "1,2", "--repeats", "2"]


@pytest.fixture(scope="module")
def server() -> Iterator[ReferenceServer]:
    with reference_server(ttft_ms=2, itl_ms=1, max_model_len=2048) as srv:
        yield srv


def bench(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BENCH, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200"},
        check=False,
    )


def records(out: Path) -> list[RequestRecord]:
    return [
        RequestRecord.model_validate_json(line)
        for line in (out / "requests.jsonl").read_text().splitlines()
    ]


def summary(out: Path) -> SweepSummary:
    return SweepSummary.model_validate_json((out / "summary.json").read_text())


def assert_complete_and_honest(out: Path, cells: int) -> SweepSummary:
    """Finished, every cell present, and no cell whose measured windows lost a request is ok."""
    result = summary(out)
    assert result.finished_unix_s is not None
    assert len(result.cells) == cells
    by_cell: dict[tuple[str, int], list[RequestRecord]] = {}
    for r in records(out):
        if r.phase == "measured" and r.label.count("/") >= 2:
            shape, level = r.label.split("/")[:2]
            by_cell.setdefault((shape, int(level[1:])), []).append(r)
    for cell in result.cells:
        lost = [r for r in by_cell.get((cell.shape, cell.concurrency), []) if not r.ok]
        if lost:
            assert cell.status in ("partial", "failed"), (cell.status, len(lost))
    return result


@pytest.mark.parametrize(
    ("mode", "every", "expected"),
    [
        ("http500", 3, "HTTP 500"),
        ("cut", 4, "connection closed by server mid-response"),
        ("stall", 5, "timed out after 2 s"),
    ],
)
def test_every_injected_fault_is_a_failed_record_and_no_lossy_cell_is_ok(
    server: ReferenceServer, tmp_path: Path, mode: str, every: int, expected: str
):
    out = tmp_path / "sweep"
    with fault_proxy(server.port, mode=mode, every=every) as proxy:
        result = bench("sweep", proxy.url, *SWEEP_FLAGS, "--timeout-s", "2", "--out", str(out))
        faulted = [rid for fault, rid in proxy.faulted if rid != "calibration-1"]
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    done = assert_complete_and_honest(out, cells=2)
    assert faulted, "the proxy injected faults"
    by_id = {r.request_id: r for r in records(out)}
    for rid in faulted:
        assert rid in by_id, f"no record for faulted request {rid}"
        assert not by_id[rid].ok and expected in (by_id[rid].error or ""), by_id[rid].error
    failed_ids = {r.request_id for r in records(out) if not r.ok}
    assert failed_ids == set(faulted), "exactly the injected faults failed"
    assert any(c.status == "partial" for c in done.cells)
    shown = " ".join(result.stdout.split())
    assert "partial, " in shown and " partial / " in shown


def test_a_rate_sweep_that_lost_requests_shows_the_loss_in_its_table(
    server: ReferenceServer, tmp_path: Path
):
    out = tmp_path / "rate"
    rate = ["--mode", "rate", "--rates", "20", "--window-s", "1", "--warmup-s", "0"]
    with fault_proxy(server.port, mode="http500", every=3) as proxy:
        result = bench("sweep", proxy.url, *rate, "--shapes", "64/8", "--out", str(out))
    assert result.returncode == 1, result.stderr[-2000:]
    (cell,) = summary(out).cells
    lost = sum(w.requests_failed for w in cell.repeats)
    assert cell.status == "partial" and lost > 0
    assert f"partial, {lost} failed" in " ".join(result.stdout.split())


def test_a_dropped_tokenize_connection_is_retried_and_the_sweep_is_whole(
    server: ReferenceServer, tmp_path: Path
):
    out = tmp_path / "sweep"
    with fault_proxy(server.port, drop_tokenize_at=3) as proxy:
        result = bench("sweep", proxy.url, *SWEEP_FLAGS, "--out", str(out))
        faulted = list(proxy.faulted)
    assert faulted == [("drop", "")]
    assert result.returncode == 0, result.stderr[-2000:]
    done = assert_complete_and_honest(out, cells=2)
    assert [c.status for c in done.cells] == ["ok", "ok"]
    assert all(r.ok for r in records(out))


def test_an_unreachable_url_is_one_line_and_leaves_no_folder(tmp_path: Path):
    out = tmp_path / "never"
    result = bench("sweep", f"http://127.0.0.1:{free_port()}", *SWEEP_FLAGS, "--out", str(out))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "cannot reach" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize(("command", "models_answered"), [("sweep", 1), ("sweep", 2), ("probe", 1)])
def test_a_server_that_dies_before_anything_is_measured_leaves_no_folder(
    server: ReferenceServer, tmp_path: Path, command: str, models_answered: int
):
    # 1: dies right after bench's own check of /v1/models; 2: after the sweep's, before its
    # calibration. (A probe has nothing unmeasured after it: its requests fail as data.)
    out = tmp_path / "never"
    flags = SWEEP_FLAGS if command == "sweep" else ["--repeats", "1", "--output-tokens", "4"]
    with fault_proxy(server.port, die_after_models=models_answered) as proxy:
        result = bench(command, proxy.url, *flags, "--out", str(out))
        assert proxy.dead.is_set()
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().count("\n") == 0 and f"bench {command}: " in result.stderr
    assert not out.exists()


def test_overwrite_against_a_server_that_dies_first_puts_the_old_results_back(
    server: ReferenceServer, tmp_path: Path
):
    out = tmp_path / "sweep"
    assert bench("sweep", server.url, *SWEEP_FLAGS, "--out", str(out)).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with fault_proxy(server.port, die_after_models=1) as proxy:
        result = bench("sweep", proxy.url, *SWEEP_FLAGS, "--out", str(out), "--overwrite")
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "moved back" in result.stdout
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not list(tmp_path.glob("sweep.replaced-*"))


def test_a_model_the_server_does_not_serve_fails_before_the_sweep(
    server: ReferenceServer, tmp_path: Path
):
    out = tmp_path / "never"
    result = bench("sweep", server.url, *SWEEP_FLAGS, "--model", "nope", "--out", str(out))
    assert result.returncode == 2
    assert "'nope' is not served" in result.stderr and "/v1/models lists" in result.stderr
    assert not out.exists()


def _kill_mid_sweep(server: EngineServer, url: str, out: Path) -> subprocess.CompletedProcess[str]:
    """Run a sweep; SIGKILL the engine once the first window's records are on disk."""
    args = [BENCH, "sweep", url, "--shapes", "32/64", "--levels", "1,2,4", "--repeats", "3"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200"}
    with subprocess.Popen(
        [*args, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as sweep:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (out / "requests.jsonl").exists():
            time.sleep(0.05)
        assert server.pgid is not None
        os.killpg(server.pgid, signal.SIGKILL)
        stdout, stderr = sweep.communicate(timeout=300)
    return subprocess.CompletedProcess(sweep.args, sweep.returncode, stdout, stderr)


def _assert_killed_sweep_ended_well(result: subprocess.CompletedProcess[str], out: Path) -> None:
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    done = assert_complete_and_honest(out, cells=3)
    assert any(r.ok for r in records(out)), "what was measured before the kill is kept"
    assert done.cells[-1].status == "failed" and done.cells[-1].reason
    assert done.counts["failed"] >= 1


@pytest.mark.slow
def test_llamacpp_killed_mid_sweep(llama_server_build, tiny_gguf_path: Path, tmp_path: Path):
    port = free_port()
    argv = llama_server_argv(llama_server_build.binary, tiny_gguf_path, port, parallel=4)
    with EngineServer("llama.cpp", argv, log_path=tmp_path / "server.log", port=port) as srv:
        srv.wait_healthy(f"http://127.0.0.1:{port}/health", 120)
        result = _kill_mid_sweep(srv, f"http://127.0.0.1:{port}", tmp_path / "sweep")
    _assert_killed_sweep_ended_well(result, tmp_path / "sweep")


@pytest.mark.slow
def test_pytorch_engine_killed_mid_sweep(tmp_path: Path):
    port = free_port()
    argv = [sys.executable, "-m", "engines.pytorch", "--model", "random:tiny"]
    argv += ["--port", str(port), "--max-running", "8", "--dtype", "auto"]
    env = {"PYTHONPATH": str(REPO_ROOT)}
    with EngineServer(
        "pytorch", argv, log_path=tmp_path / "server.log", port=port, env=env, cwd=REPO_ROOT
    ) as srv:
        srv.wait_healthy(f"http://127.0.0.1:{port}/health", 120)
        result = _kill_mid_sweep(srv, f"http://127.0.0.1:{port}", tmp_path / "sweep")
    _assert_killed_sweep_ended_well(result, tmp_path / "sweep")
