"""Status to SSM (moto server): phase changes at once, heartbeats, 4 KB, outages, redaction."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime

import boto3
import pytest

from agent.aws.secrets import read_hf_token
from agent.aws.status import StatusPublisher
from contract.layout import status_parameter_name
from contract.status import STATUS_MAX_BYTES, ShardStatus
from tests.agent.aws.conftest import CAMPAIGN, SHARD
from tests.fixtures.flaky_proxy import flaky_proxy
from tests.fixtures.moto_server import MotoServer

NAME = status_parameter_name(CAMPAIGN, SHARD)


def _parameter() -> tuple[ShardStatus, str, int] | None:
    """The published status, read from moto directly (never through a test's proxy)."""
    ssm = boto3.client("ssm", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    try:
        p = ssm.get_parameter(Name=NAME)["Parameter"]
    except ssm.exceptions.ParameterNotFound:
        return None
    return ShardStatus.from_parameter_value(p["Value"]), p["Value"], int(p["Version"])


def _wait_for(check: Callable[[ShardStatus], bool], timeout_s: float = 5.0) -> ShardStatus:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        got = _parameter()
        if got is not None:
            last = got[0]
            if check(last):
                return last
        time.sleep(0.05)
    raise AssertionError(f"status never matched; last seen: {last}")


def _publisher(**kwargs: object) -> StatusPublisher:
    defaults: dict[str, object] = {
        "instance_id": "i-0abc",
        "market": "spot",
        "results_uri": f"s3://b/results/{CAMPAIGN}/{SHARD}/",
        "heartbeat_s": 30.0,
    }
    defaults.update(kwargs)
    return StatusPublisher(CAMPAIGN, SHARD, **defaults)  # type: ignore[arg-type]


def test_start_publishes_booting_then_each_phase(aws: MotoServer):
    publisher = _publisher().start()
    try:
        first = _wait_for(lambda s: s.phase == "booting")
        assert (first.campaign, first.shard, first.instance_id) == (CAMPAIGN, SHARD, "i-0abc")
        assert first.market == "spot"
        publisher.set_phase("installing")
        publisher.set_job(1, 4, "vllm-d4.probe")
        publisher.set_phase("serving")
        status = _wait_for(lambda s: s.phase == "serving")
        assert (status.job_index, status.jobs_total, status.current_job) == (1, 4, "vllm-d4.probe")
    finally:
        publisher.close()


def test_heartbeat_refreshes_the_parameter_without_changes(aws: MotoServer):
    publisher = _publisher(heartbeat_s=0.25).start()
    try:
        _wait_for(lambda s: s.phase == "booting")
        got = _parameter()
        assert got is not None
        version = got[2]
        time.sleep(1.2)
        got = _parameter()
        assert got is not None
        assert got[2] >= version + 2  # about one put per 0.25 s, no change requested
    finally:
        publisher.close()


def test_type_overwrite_and_final_status_on_close(aws: MotoServer):
    publisher = _publisher().start()
    publisher.set_phase("done")
    assert publisher.close()
    p = boto3.client("ssm").get_parameter(Name=NAME)["Parameter"]
    assert p["Type"] == "String"
    assert json.loads(p["Value"])["phase"] == "done"


def test_huge_error_is_truncated_under_4_kb(aws: MotoServer):
    publisher = _publisher()
    publisher.set_phase("failed", error="Traceback: " + 'é"\\\n' * 5000)
    assert publisher.publish_now()
    got = _parameter()
    assert got is not None
    status, value, _ = got
    assert len(value.encode()) <= STATUS_MAX_BYTES
    assert status.phase == "failed"
    assert status.last_error is not None and status.last_error.startswith("Traceback: ")
    assert status.last_error.endswith("…")


def test_contract_truncation_never_fails():
    now = datetime.now(UTC)
    long = "x" * 3000
    status = ShardStatus(
        campaign="c" * 128,
        shard="s" * 128,
        phase="failed",
        started_at=now,
        updated_at=now,
        last_error="\u2603" * 5000,
        upload_error=long,
        current_job=long,
        results_uri=long,
    )
    value = status.to_parameter_value()
    assert len(value.encode()) <= STATUS_MAX_BYTES
    assert ShardStatus.from_parameter_value(value).campaign == "c" * 128


def test_ssm_outage_never_blocks_or_raises_and_catches_up(
    aws: MotoServer, monkeypatch: pytest.MonkeyPatch
):
    with flaky_proxy(aws.url) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SSM", proxy.url)  # SSM only, through the proxy
        proxy.set_mode("refuse")
        publisher = _publisher(heartbeat_s=5.0).start()
        try:
            started = time.monotonic()
            publisher.set_phase("installing")
            publisher.set_phase("serving", error="engine slow to start")
            assert time.monotonic() - started < 0.5  # callers never wait on SSM
            time.sleep(1.0)
            assert _parameter() is None  # nothing got through
            proxy.set_mode("forward")
            status = _wait_for(lambda s: s.phase == "serving", timeout_s=10)
            assert status.last_error == "engine slow to start"
        finally:
            publisher.close()


def test_uploads_pending_and_the_token_are_handled(
    aws: MotoServer, hf_secret: str, token_marker: str
):
    read_hf_token()  # registers the value for redaction
    publisher = _publisher()
    publisher.set_uploads(2, "transient: SlowDown")
    publisher.set_phase("failed", error=f"engine died; env HF_TOKEN={token_marker}")
    assert publisher.publish_now()
    got = _parameter()
    assert got is not None
    status, value, _ = got
    assert token_marker not in value
    assert status.last_error == "engine died; env HF_TOKEN=***"
    assert (status.uploads_pending, status.upload_error) == (2, "transient: SlowDown")


def test_eta_from_job_durations(aws: MotoServer):
    publisher = _publisher()
    publisher.set_job(3, 10, "c")  # a resumed shard: jobs 1-2 were done before
    assert publisher.status.eta is None
    time.sleep(1.0)
    publisher.set_job(4, 10, "d")
    eta = publisher.status.eta
    assert eta is not None
    # About 1 s per job, 7 jobs left (4..10): not 7/3 s as if jobs 1-2 had run here.
    left = (eta - datetime.now(UTC)).total_seconds()
    assert 5 <= left <= 9
    publisher.set_phase("done")
    assert publisher.status.eta is None


def test_heartbeat_must_be_at_most_a_minute(aws: MotoServer):
    with pytest.raises(ValueError, match="heartbeat"):
        _publisher(heartbeat_s=61)
