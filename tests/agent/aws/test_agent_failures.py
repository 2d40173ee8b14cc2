"""Failures before the first job, as the agent process meets them on an instance: each is
published as `failed` with its reason (no traceback, no status stuck at `booting`), and the
agent owns the power-off: after the grace period, and never with `end_action = "stay"`
(issue 21, items 5-7)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from contract.layout import FAILURE_GRACE_MIN, status_parameter_name
from tests.agent.aws.conftest import BUCKET, CAMPAIGN, SHARD
from tests.agent.aws.test_agent_process import SPEC, _setup
from tests.fixtures.fake_imds import FakeImds
from tests.fixtures.moto_server import MotoServer


def _run_agent(tmp_path: Path, moto: MotoServer, imds: FakeImds, secret: str) -> str:
    env = {
        **moto.env(),
        "PATH": "/usr/bin:/bin",
        "BENCH_BUCKET": BUCKET,
        "BENCH_HF_SECRET_ID": secret,
        "BENCH_IMDS_ENDPOINT": imds.url,
        "BENCH_POWEROFF_FILE": str(tmp_path / "poweroff.txt"),
    }
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "--work-dir", str(work)],
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        cwd=work,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]  # handled: the agent decided the end
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr


def _status() -> dict:
    value = boto3.client("ssm").get_parameter(Name=status_parameter_name(CAMPAIGN, SHARD))
    return json.loads(value["Parameter"]["Value"])


def test_a_missing_spec_is_published_as_failed_and_powers_off_after_the_grace(
    tmp_path: Path, aws: MotoServer, bucket: str, imds: FakeImds, hf_secret: str
):
    _run_agent(tmp_path, aws, imds, hf_secret)
    status = _status()
    assert status["phase"] == "failed"
    assert status["last_error"].startswith(f"spec: campaign spec s3://{BUCKET}/campaigns/")
    assert "not found" in status["last_error"]
    assert (tmp_path / "poweroff.txt").read_text().endswith(f"(in {FAILURE_GRACE_MIN} min)\n")


@pytest.mark.parametrize("end_action", ["terminate", "stay"])
def test_an_unset_hf_token_is_published_as_failed_and_stay_is_honoured(
    tmp_path: Path, aws: MotoServer, bucket: str, imds: FakeImds, end_action: str
):
    # The stack creates the secret with no value; the user has not put the token in yet.
    arn = boto3.client("secretsmanager").create_secret(Name="bench-hf-token-empty")["ARN"]
    _setup(bucket, SPEC.replace('end_action = "terminate"', f'end_action = "{end_action}"'))
    _run_agent(tmp_path, aws, imds, arn)
    status = _status()
    assert status["phase"] == "failed" and status["last_error"].startswith("HF token: ")
    poweroff = tmp_path / "poweroff.txt"
    if end_action == "stay":
        assert not poweroff.exists(), "end_action stay: the instance stays"
    else:
        assert poweroff.read_text().endswith(f"(in {FAILURE_GRACE_MIN} min)\n")


def test_logs_outside_the_shard_folder_go_into_it_redacted(tmp_path: Path):
    from agent.__main__ import _collect_logs

    work = tmp_path / "work"
    (work / "engines" / "llamacpp").mkdir(parents=True)
    (work / "agent.log").write_text("START agent\n")
    (work / "engines" / "llamacpp" / "install.log").write_text("cmake ... token hf_SECRET\n")
    (work / "engines" / "llamacpp" / "build.log").write_text("-- CUDA found hf_SECRET\n")
    _collect_logs(work, tmp_path / "shard" / "logs", secrets=["hf_SECRET"])
    logs = tmp_path / "shard" / "logs"
    assert (logs / "agent.log").read_text() == "START agent\n"
    assert (logs / "llamacpp-install.log").read_text() == "cmake ... token ***\n"
    assert (logs / "llamacpp-build.log").read_text() == "-- CUDA found ***\n"


def test_logs_that_cannot_be_copied_cost_nothing_else(tmp_path: Path, caplog):
    from agent.__main__ import _collect_logs

    work = tmp_path / "work"
    work.mkdir()
    (work / "agent.log").write_text("START agent\n")
    blocked = tmp_path / "shard" / "logs"
    blocked.parent.mkdir()
    blocked.write_text("a file where the logs folder should be")
    _collect_logs(work, blocked, secrets=[])  # returns: the upload and status go on
    assert blocked.read_text() == "a file where the logs folder should be"
    assert "cannot copy" in caplog.text and "agent.log" in caplog.text
