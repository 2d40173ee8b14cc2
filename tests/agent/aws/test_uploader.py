"""Results to S3 (moto server, and a proxy that makes it fail): jobs at once, `done` last,
nothing lost while S3 is down, resume listing and restore, tarball, manifest, the spec."""

from __future__ import annotations

import os
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from agent.aws.bucket import UploadError
from agent.aws.restore import download_spec, jobs_done_in_s3, restore_done_jobs
from agent.aws.secrets import read_hf_token
from agent.aws.status import StatusPublisher
from agent.aws.tarball import make_tarball
from agent.aws.uploader import Backoff, ResultsUploader
from contract.layout import job_prefix, results_prefix, spec_key
from tests.agent.aws.conftest import CAMPAIGN, SHARD
from tests.fixtures.flaky_proxy import ProxyMode, flaky_proxy
from tests.fixtures.moto_server import MotoServer

FAST = Backoff(base_s=0.1, max_s=0.5)


def _s3() -> object:
    """An S3 client on moto directly (never through a test's proxy)."""
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])


def _objects(bucket: str, prefix: str = "") -> dict[str, bytes]:
    s3 = _s3()
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):  # type: ignore[attr-defined]
        for obj in page.get("Contents", []):
            out[obj["Key"]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()  # type: ignore[attr-defined]
    return out


def _until(check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.05)


def _write_job(shard_dir: Path, job: str, *, done: bool = True, extra: str = "") -> Path:
    job_dir = shard_dir / "jobs" / job
    job_dir.mkdir(parents=True)
    (job_dir / "requests.jsonl").write_text(f'{{"request_id": "{job}-1"}}\n' * 50)
    (job_dir / "summary.json").write_text(f'{{"job": "{job}"}}')
    (job_dir / "server.log").write_text(f"server of {job}\n{extra}")
    (job_dir / "sub").mkdir()
    (job_dir / "sub" / "nested.txt").write_text("nested")
    if done:
        (job_dir / "done").write_text("")
    return job_dir


def test_job_folder_uploaded_with_done_last_and_listed(bucket: str, tmp_path: Path):
    _write_job(tmp_path, "llamacpp.probe")
    _write_job(tmp_path, "llamacpp.sweep", done=False)  # interrupted: uploaded, not done
    uploader = ResultsUploader(CAMPAIGN, SHARD, tmp_path).start()
    uploader.upload_job("llamacpp.probe")
    uploader.upload_job("llamacpp.sweep")
    assert uploader.close(timeout_s=20) == []

    prefix = job_prefix(CAMPAIGN, SHARD, "llamacpp.probe")
    got = _objects(bucket, prefix)
    local = tmp_path / "jobs" / "llamacpp.probe"
    assert got == {
        prefix + p.relative_to(local).as_posix(): p.read_bytes()
        for p in local.rglob("*")
        if p.is_file()
    }
    probe_keys = [k for k in uploader.uploaded_keys if k.startswith(prefix)]
    assert probe_keys[-1] == prefix + "done"
    assert jobs_done_in_s3(CAMPAIGN, SHARD) == {"llamacpp.probe"}
    assert uploader.results_uri == f"s3://{bucket}/{results_prefix(CAMPAIGN, SHARD)}"


@pytest.mark.parametrize("failure", ["refuse", "http503"])
def test_s3_down_for_a_while_loses_nothing(
    bucket: str,
    aws: MotoServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    failure: ProxyMode,
):
    with flaky_proxy(aws.url) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)  # S3 only; SSM stays direct
        status = StatusPublisher(CAMPAIGN, SHARD)
        reports: list[tuple[int, str | None]] = []

        def on_backlog(pending: int, error: str | None) -> None:
            reports.append((pending, error))
            status.set_uploads(pending, error)

        uploader = ResultsUploader(
            CAMPAIGN, SHARD, tmp_path, backoff=FAST, on_backlog=on_backlog
        ).start()
        try:
            proxy.set_mode(failure)
            down_since = time.monotonic()
            jobs = [f"job-{i}" for i in range(3)]
            for job in jobs:
                _write_job(tmp_path, job)
                uploader.upload_job(job)  # returns at once, S3 or not
            # botocore's own retries (up to ~6 s) come before the first failure report.
            _until(lambda: bool(reports) and reports[-1][0] == 3, timeout_s=20)
            time.sleep(max(0.0, 2.0 - (time.monotonic() - down_since)))  # down a while

            assert uploader.pending == jobs
            assert reports[-1][1]
            assert status.status.uploads_pending == 3 and status.status.upload_error
            assert _objects(bucket) == {}
            if failure == "http503":
                assert proxy.failed_requests >= 3
                assert "SlowDown" in (reports[-1][1] or "")

            proxy.set_mode("forward")
            assert uploader.close(timeout_s=30) == []
        finally:
            uploader.close(timeout_s=0)
        assert reports[-1] == (0, None)
        assert status.status.uploads_pending == 0
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")

    got = _objects(bucket)
    for job in jobs:
        local = tmp_path / "jobs" / job
        prefix = job_prefix(CAMPAIGN, SHARD, job)
        for path in local.rglob("*"):
            if path.is_file():
                assert got[prefix + path.relative_to(local).as_posix()] == path.read_bytes()
    assert jobs_done_in_s3(CAMPAIGN, SHARD) == set(jobs)


def test_drain_is_bounded_when_s3_stays_down(
    bucket: str, aws: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    with flaky_proxy(aws.url) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        proxy.set_mode("refuse")
        uploader = ResultsUploader(CAMPAIGN, SHARD, tmp_path, backoff=FAST).start()
        _write_job(tmp_path, "j1")
        uploader.upload_job("j1")
        started = time.monotonic()
        assert uploader.close(timeout_s=1.5) == ["j1"]
        assert time.monotonic() - started < 5
    assert (tmp_path / "jobs" / "j1" / "done").exists()  # still on disk


def test_a_relaunched_shard_restores_done_jobs(bucket: str, tmp_path: Path):
    first = tmp_path / "first"
    _write_job(first, "a")
    _write_job(first, "b")
    _write_job(first, "c", done=False)
    uploader = ResultsUploader(CAMPAIGN, SHARD, first).start()
    for job in ("a", "b", "c"):
        uploader.upload_job(job)
    assert uploader.close(timeout_s=20) == []

    second = tmp_path / "second"
    assert restore_done_jobs(CAMPAIGN, SHARD, second) == {"a", "b"}
    for job in ("a", "b"):
        for path in (first / "jobs" / job).rglob("*"):
            if path.is_file():
                twin = second / "jobs" / job / path.relative_to(first / "jobs" / job)
                assert twin.read_bytes() == path.read_bytes()
    assert not (second / "jobs" / "c").exists()


def test_final_manifest_and_tarball(bucket: str, tmp_path: Path):
    shard_dir = tmp_path / SHARD
    _write_job(shard_dir, "a")
    (shard_dir / "manifest.json").write_text('{"agent": "x"}')
    (shard_dir / "agent.log").write_text("START a\nEND a\n")
    tarball = make_tarball(shard_dir, shard_dir / "results.tar.gz")
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    assert f"{SHARD}/jobs/a/done" in names
    assert f"{SHARD}/manifest.json" in names and f"{SHARD}/agent.log" in names
    assert f"{SHARD}/results.tar.gz" not in names

    uploader = ResultsUploader(CAMPAIGN, SHARD, shard_dir).start()
    uploader.upload_final(shard_dir / "manifest.json", tarball)
    assert uploader.close(timeout_s=20) == []
    got = _objects(bucket, results_prefix(CAMPAIGN, SHARD))
    assert got[results_prefix(CAMPAIGN, SHARD) + "manifest.json"] == b'{"agent": "x"}'
    assert got[results_prefix(CAMPAIGN, SHARD) + "results.tar.gz"] == tarball.read_bytes()


def test_token_never_reaches_s3_or_the_tarball(
    bucket: str, hf_secret: str, token_marker: str, tmp_path: Path
):
    read_hf_token()
    shard_dir = tmp_path / SHARD
    # An engine that echoes its environment into its log, a manifest written carelessly.
    _write_job(shard_dir, "a", extra=f"env: HF_TOKEN={token_marker}\n")
    (shard_dir / "manifest.json").write_text(f'{{"env": {{"HF_TOKEN": "{token_marker}"}}}}')
    uploader = ResultsUploader(CAMPAIGN, SHARD, shard_dir).start()
    uploader.upload_job("a")
    tarball = make_tarball(shard_dir, tmp_path / "results.tar.gz")
    uploader.upload_final(shard_dir / "manifest.json", tarball)
    assert uploader.close(timeout_s=20) == []

    marker = token_marker.encode()
    for key, body in _objects(bucket).items():
        assert marker not in body, key
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            if member.isfile():
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                assert marker not in data, member.name
    assert b"HF_TOKEN=***" in (shard_dir / "jobs" / "a" / "server.log").read_bytes()


def test_campaign_spec_download(bucket: str, tmp_path: Path):
    with pytest.raises(UploadError, match=f"s3://{bucket}/{spec_key(CAMPAIGN)}"):
        download_spec(CAMPAIGN, tmp_path / "spec.toml")
    _s3().put_object(Bucket=bucket, Key=spec_key(CAMPAIGN), Body=b'name = "camp-1"\n')  # type: ignore[attr-defined]
    path = download_spec(CAMPAIGN, tmp_path / "spec.toml")
    assert path.read_bytes() == b'name = "camp-1"\n'


def test_upload_job_returns_at_once_while_s3_hangs(
    bucket: str, aws: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Queueing must never wait on S3: the benchmark goes on while uploads retry.
    with flaky_proxy(aws.url) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        proxy.set_mode("refuse")
        uploader = ResultsUploader(CAMPAIGN, SHARD, tmp_path, backoff=FAST).start()
        _write_job(tmp_path, "a")
        started = time.monotonic()
        uploader.upload_job("a")
        assert time.monotonic() - started < 0.2
        assert threading.active_count() >= 2
        proxy.set_mode("forward")
        assert uploader.close(timeout_s=20) == []


def test_layout_names_for_spec_jobs_and_final_files():
    assert spec_key("c1") == "campaigns/c1/spec.toml"
    assert job_prefix("c1", "s-0", "vllm-d4.sweep") == "results/c1/s-0/jobs/vllm-d4.sweep/"
    with pytest.raises(ValueError, match="job"):
        job_prefix("c1", "s-0", "a/b")
