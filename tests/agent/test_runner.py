"""The campaign runner on this machine with real engines: llama.cpp and our PyTorch engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.gpu import GpuHost
from agent.runner import CampaignRunner
from contract.jobs import JobRecord, Manifest
from contract.spec import parse_campaign
from engines.campaign import check_campaign

pytestmark = pytest.mark.slow

SPEC = """
name = "runner-test"
end_action = "stay"
[model]
name = "tiny"
sources = { llamacpp = "generated:tiny-llama", pytorch = "random:{pytorch_model}" }
[[shards]]
name = "here"
instance_type = "local"
arms = ["pytorch", "llama"]
[suite.probe]
output_tokens = 16
repeats = 1
at_once = 2
[suite.sweep]
shapes = ["64/16"]
levels = [1, 2]
repeats = 1
"""


def _runner(tmp_path: Path, pytorch_model: str, llama_server_build) -> CampaignRunner:
    spec = check_campaign(parse_campaign(SPEC.replace("{pytorch_model}", pytorch_model)))
    return CampaignRunner(
        spec,
        spec.shards[0],
        tmp_path / "results",
        tmp_path / "work",
        gpu=GpuHost(compute_capability=None),
    )


def test_a_failing_engine_is_recorded_and_the_campaign_goes_on(
    tmp_path: Path,
    llama_server_build,
):
    outcome = _runner(tmp_path, "no-such-model", llama_server_build).run()
    by_job = {r.job_id: r for r in outcome.records}
    assert set(by_job) == {"pytorch-probe", "pytorch-sweep", "llama-probe", "llama-sweep"}
    for job in ("pytorch-probe", "pytorch-sweep"):
        assert by_job[job].status == "failed"
        assert "pytorch" in (by_job[job].reason or "")
        assert by_job[job].server_log_tail, "the server log's tail comes with the failure"
        assert not (outcome.shard_dir / "jobs" / job / "done").exists()
    for job in ("llama-probe", "llama-sweep"):
        record = JobRecord.model_validate_json(
            (outcome.shard_dir / "jobs" / job / "job.json").read_text()
        )
        assert record.status == "ok", record.reason
        assert record.health_s is not None and record.first_completion_s is not None
        assert record.engine and record.engine.variant == "cpu"
        assert (outcome.shard_dir / "jobs" / job / "done").exists()
        assert (outcome.shard_dir / "jobs" / job / "summary.json").exists()
        assert (outcome.shard_dir / "jobs" / job / "server.log").stat().st_size > 0
    manifest = Manifest.model_validate_json((outcome.shard_dir / "manifest.json").read_text())
    assert manifest.jobs_failed == ["pytorch-probe", "pytorch-sweep"]
    assert sorted(manifest.jobs_ok) == ["llama-probe", "llama-sweep"]
    assert manifest.finished_unix_s is not None
    llama = next(e for e in manifest.engines if e.arm == "llama")
    assert llama.binary_sha256 and len(llama.binary_sha256) == 64
    assert llama.version_text and "build 11312" in llama.version_text
    # Install facts: llama.cpp's CPU server is compiled here, unpatched, nothing beside it.
    assert (llama.patches, llama.extra_packages, llama.built_from_source) == ([], [], True)
    polled = (outcome.shard_dir / "server_metrics.csv").read_text().splitlines()
    assert any(",llama-probe,server," in row for row in polled), "probe jobs are polled too"
    rows = (outcome.shard_dir / "telemetry.csv").read_text().splitlines()
    assert any(",llama-sweep," in row for row in rows), "telemetry rows carry the job id"


def test_a_rerun_skips_done_jobs_and_retries_failed_ones(
    tmp_path: Path,
    llama_server_build,
):
    first = _runner(tmp_path, "no-such-model", llama_server_build).run()
    assert len(first.failed) == 2
    done_before = (first.shard_dir / "jobs" / "llama-sweep" / "done").stat().st_mtime_ns
    second = _runner(tmp_path, "tiny", llama_server_build).run()
    assert {r.job_id for r in second.records} == {"pytorch-probe", "pytorch-sweep"}
    assert all(r.status == "ok" for r in second.records), [r.reason for r in second.records]
    for job in ("pytorch-probe", "pytorch-sweep"):
        # The failed attempt's files are kept apart, the retry's are its own.
        folder = first.shard_dir / "jobs" / job
        earlier = JobRecord.model_validate_json((folder / "earlier-1" / "job.json").read_text())
        assert earlier.status == "failed"
        assert JobRecord.model_validate_json((folder / "job.json").read_text()).status == "ok"
        records = (folder / "requests.jsonl").read_text().splitlines()
        ids = [json.loads(line)["request_id"] for line in records]
        assert ids and len(ids) == len(set(ids))
    assert (first.shard_dir / "jobs" / "llama-sweep" / "done").stat().st_mtime_ns == done_before


def test_bench_run_runs_a_spec_as_a_real_subprocess(tmp_path: Path, llama_server_build):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.replace("{pytorch_model}", "tiny").replace('"pytorch", ', ""))
    env_bench = str(Path(sys.executable).with_name("bench"))
    result = subprocess.run(
        [env_bench, "run", str(spec), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            "BENCH_CACHE_DIR": str(tmp_path / "cache"),
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
            "COLUMNS": "160",
            "LLAMA_SERVER_BIN": str(llama_server_build.binary),
        },
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "llama-sweep" in result.stdout and "results:" in result.stdout
    shard = tmp_path / "out" / "runner-test" / "here"
    assert json.loads((shard / "manifest.json").read_text())["jobs_failed"] == []


def test_an_engine_killed_mid_sweep_fails_that_job_and_the_next_job_runs(
    tmp_path: Path, llama_server_build
):
    import os
    import signal
    import threading
    import time

    spec = check_campaign(parse_campaign(
        SPEC.replace("{pytorch_model}", "tiny").replace('"pytorch", ', "")
        .replace('shapes = ["64/16"]', 'shapes = ["64/512"]')
        .replace("levels = [1, 2]\nrepeats = 1", "levels = [1, 2, 4]\nrepeats = 30")
        + "[suite.bfcl]\nlimit = 2\nmax_tokens = 16\n"
    ))  # fmt: skip
    runner = CampaignRunner(
        spec, spec.shards[0], tmp_path / "results", tmp_path / "work",
        gpu=GpuHost(compute_capability=None),
    )  # fmt: skip
    sweep_dir = tmp_path / "results" / "jobs" / "llama-sweep"
    killed = threading.Event()

    def kill_during_sweep() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (sweep_dir / "requests.jsonl").exists():
            time.sleep(0.05)
        with runner._server_lock:
            server = runner._server
        if server is not None and server.pgid is not None:
            os.killpg(server.pgid, signal.SIGKILL)
            killed.set()

    thread = threading.Thread(target=kill_during_sweep)
    thread.start()
    outcome = runner.run()
    thread.join()
    assert killed.is_set()
    by_job = {r.job_id: r for r in outcome.records}
    assert by_job["llama-probe"].status == "ok"
    assert by_job["llama-sweep"].status == "failed"
    assert "server exited during the job" in (by_job["llama-sweep"].reason or "")
    assert by_job["llama-bfcl"].status == "ok", by_job["llama-bfcl"].reason
