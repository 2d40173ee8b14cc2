"""The agent as its own process, against a moto server and the fake IMDS, as on an instance.

It reads who it is from IMDS tags, the spec from S3, the HF token from Secrets Manager;
serves llama.cpp on the tiny model; uploads every job; publishes status to SSM; resumes
from what S3 has; and on a spot notice uploads what is done and stops as `interrupted`.
The HF token (a marker) must appear in no log, status, manifest, tarball or process argv.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import psutil
import pytest

from contract.layout import AGENT_ENV_BUCKET, AGENT_ENV_HF_SECRET_ID, status_parameter_name
from tests.agent.aws.conftest import BUCKET, CAMPAIGN, SHARD
from tests.fixtures.fake_imds import FakeImds
from tests.fixtures.moto_server import MotoServer
from tests.fixtures.processes import ended_at_exit
from tests.fixtures.slow_hub import slow_hub

__all__ = ["ended_at_exit"]  # a fixture used here

pytestmark = pytest.mark.slow

SPEC = f"""
name = "{CAMPAIGN}"
end_action = "terminate"
[model]
name = "tiny"
sources = {{ llamacpp = "generated:tiny-llama" }}
[[shards]]
name = "{SHARD}"
instance_type = "g6.xlarge"
arms = ["llama"]
[arms.llama]
settings = {{ n_gpu_layers = "0", flash_attn = "off", parallel = 4, ctx_size = 8192 }}
[suite.probe]
output_tokens = 16
repeats = 1
at_once = 2
[suite.sweep]
shapes = ["64/16"]
levels = [1, 2]
repeats = 1
"""


LONG_SWEEP = SPEC.replace('shapes = ["64/16"]', 'shapes = ["64/512"]').replace(
    "levels = [1, 2]\nrepeats = 1", "levels = [1, 2, 4]\nrepeats = 30"
)


def _agent(
    tmp_path: Path,
    moto: MotoServer,
    imds: FakeImds,
    llama_bin: Path,
    secret: str,
    work: Path,
    **extra_env: str,
) -> subprocess.Popen[str]:
    env = {
        **extra_env,
        # A worktree's code shadows the editable install (the team's set-up); unset in CI.
        **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        **moto.env(),
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        AGENT_ENV_BUCKET: BUCKET,
        AGENT_ENV_HF_SECRET_ID: secret,
        "BENCH_IMDS_ENDPOINT": imds.url,
        "BENCH_POWEROFF_FILE": str(tmp_path / "poweroff.txt"),
        "LLAMA_SERVER_BIN": str(llama_bin),
        "BENCH_CACHE_DIR": str(tmp_path / "cache"),
        "BENCH_SPOT_POLL_S": "0.2",
    }
    work.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "--work-dir", str(work)],
        env=env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _status() -> dict:
    value = boto3.client("ssm").get_parameter(Name=status_parameter_name(CAMPAIGN, SHARD))
    return json.loads(value["Parameter"]["Value"])


def _keys() -> list[str]:
    listing = boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="results/")
    return [o["Key"] for o in listing.get("Contents", [])]


def _setup(bucket: str, spec: str = SPEC) -> None:
    boto3.client("s3").put_object(
        Bucket=bucket, Key=f"campaigns/{CAMPAIGN}/spec.toml", Body=spec.encode()
    )


def test_agent_runs_a_shard_uploads_every_job_and_keeps_the_token_secret(
    tmp_path: Path,
    aws: MotoServer,
    bucket: str,
    imds: FakeImds,
    hf_secret: str,
    token_marker: str,
    llama_server_build,
    ended_at_exit,
):
    _setup(bucket)
    work = tmp_path / "work"
    proc = ended_at_exit(_agent(tmp_path, aws, imds, llama_server_build.binary, hf_secret, work))
    argvs: list[str] = []
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                argvs.append(" ".join(child.cmdline()))
        time.sleep(0.2)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output[-3000:]
    status = _status()
    assert status["phase"] == "done" and status["jobs_total"] == 2
    keys = _keys()
    prefix = f"results/{CAMPAIGN}/{SHARD}/"
    for job in ("llama-probe", "llama-sweep"):
        assert f"{prefix}jobs/{job}/done" in keys
        assert f"{prefix}jobs/{job}/summary.json" in keys
    assert f"{prefix}manifest.json" in keys and f"{prefix}results.tar.gz" in keys
    assert "campaign shard finished" in (tmp_path / "poweroff.txt").read_text()
    # The token: nowhere but memory and the engines' environment.
    assert token_marker not in output
    assert all(token_marker not in a for a in argvs)
    assert token_marker not in json.dumps(status)
    for path in work.rglob("*"):
        if path.is_file() and "cache" not in path.parts:
            assert token_marker.encode() not in path.read_bytes(), path
    s3 = boto3.client("s3")
    for key in keys:
        assert token_marker.encode() not in s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    # A relaunched shard finds everything done in S3 and runs nothing again.
    rerun = _agent(tmp_path, aws, imds, llama_server_build.binary, hf_secret, tmp_path / "w2")
    ended_at_exit(rerun)
    rerun_output = rerun.communicate(timeout=300)[0]
    assert rerun.returncode == 0, rerun_output[-3000:]
    assert "every job done already" in rerun_output


def test_a_spot_notice_uploads_what_is_done_and_stops(
    tmp_path: Path,
    aws: MotoServer,
    bucket: str,
    imds: FakeImds,
    hf_secret: str,
    llama_server_build,
    ended_at_exit,
):
    _setup(bucket, LONG_SWEEP)
    proc = _agent(tmp_path, aws, imds, llama_server_build.binary, hf_secret, tmp_path / "w")
    ended_at_exit(proc)
    deadline = time.monotonic() + 240
    prefix = f"results/{CAMPAIGN}/{SHARD}/jobs/llama-probe/done"
    sweep_dir = tmp_path / "w" / "results" / CAMPAIGN / SHARD / "jobs" / "llama-sweep"
    while time.monotonic() < deadline and not (sweep_dir / "requests.jsonl").exists():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.05)
    imds.issue_spot_notice()
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 3, "\n".join(
        line for line in output.splitlines() if "httpx" not in line
    )[-6000:]
    assert _status()["phase"] == "interrupted"
    keys = _keys()
    assert prefix in keys
    assert f"results/{CAMPAIGN}/{SHARD}/jobs/llama-sweep/done" not in keys, "stopped mid-sweep"
    # No tarball after an interruption: the logs went up loose, under this instance's id.
    logs = f"results/{CAMPAIGN}/{SHARD}/logs/interrupted-{imds.instance_id}/"
    assert f"{logs}agent.log" in keys and f"{logs}llamacpp-install.log" in keys, keys


def test_a_spot_notice_during_the_model_download_stops_it_and_publishes_interrupted(
    tmp_path: Path,
    aws: MotoServer,
    bucket: str,
    imds: FakeImds,
    hf_secret: str,
    llama_server_build,
    ended_at_exit,
):
    repo = f"org/slow-{uuid.uuid4().hex[:8]}"
    _setup(bucket, SPEC.replace("generated:tiny-llama", f"{repo}:tiny.gguf"))
    # 4 MiB at 64 KiB a second: a download that would take a minute.
    with slow_hub(repo, "tiny.gguf", bytes(4 << 20), chunk_bytes=64 << 10, delay_s=1.0) as hub:
        proc = _agent(
            tmp_path, aws, imds, llama_server_build.binary, hf_secret, tmp_path / "w",
            HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"),
        )  # fmt: skip
        ended_at_exit(proc)
        assert hub.get_started.wait(240), proc.communicate(timeout=60)[0][-3000:]
        imds.issue_spot_notice()
        noticed = time.monotonic()
        output = proc.communicate(timeout=120)[0]
        assert proc.returncode == 3, output[-3000:]
        assert time.monotonic() - noticed < 60, "the download was not stopped promptly"
    assert _status()["phase"] == "interrupted"
    assert "download interrupted" in output
    left = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if repo in " ".join(process.info["cmdline"] or ()):
                left.append(process)
    assert not left, "the download outlived the agent"
