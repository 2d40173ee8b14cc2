"""The AWS pieces wired the way the runner wires them (moto server + fake IMDS):

identity and tags from IMDS, the spec from S3, status to SSM, each job uploaded at once, a
spot notice that ends the shard as `interrupted` with everything finished in S3, and a grep
for the HF token marker in every log line, status version, S3 object and the tarball.
"""

from __future__ import annotations

import logging
import os
import tarfile
import threading
from pathlib import Path

import boto3
import pytest

from agent.aws.bucket import results_uri
from agent.aws.imds import ImdsClient, SpotNotice
from agent.aws.restore import download_spec, jobs_done_in_s3
from agent.aws.secrets import engine_env, read_hf_token
from agent.aws.spot import SpotWatcher
from agent.aws.status import StatusPublisher
from agent.aws.tarball import make_tarball
from agent.aws.uploader import ResultsUploader
from contract.layout import spec_key, status_parameter_name
from contract.status import STATUS_MAX_BYTES, ShardStatus
from tests.agent.aws.conftest import CAMPAIGN, SHARD
from tests.fixtures.fake_imds import FakeImds


def test_campaign_interrupted_by_spot_keeps_every_finished_job_and_no_token(
    bucket: str,
    imds: FakeImds,
    hf_secret: str,
    token_marker: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.DEBUG)
    boto3.client("s3").put_object(Bucket=bucket, Key=spec_key(CAMPAIGN), Body=b'name = "c"\n')

    with ImdsClient() as metadata:
        identity = metadata.identity()
        campaign, shard = metadata.campaign_and_shard()
        shard_dir = tmp_path / shard
        download_spec(campaign, shard_dir / "spec.toml")
        token = read_hf_token()
        assert engine_env(token)["HF_TOKEN"] == token_marker

        status = StatusPublisher(
            campaign,
            shard,
            instance_id=identity.instance_id,
            market=identity.market,
            results_uri=results_uri(campaign, shard),
            heartbeat_s=0.5,
        ).start()
        uploader = ResultsUploader(campaign, shard, shard_dir, on_backlog=status.set_uploads)
        uploader.start()

        interrupted = threading.Event()

        def on_notice(notice: SpotNotice) -> None:
            status.set_phase("interrupted", error=f"spot notice: {notice.action}")
            interrupted.set()

        watcher = SpotWatcher(metadata, on_notice, poll_s=0.05).start()
        jobs = ["llamacpp.probe", "llamacpp.sweep", "pytorch.probe", "pytorch.sweep"]
        finished = []
        for index, job in enumerate(jobs, start=1):
            if interrupted.is_set():
                break
            status.set_job(index, len(jobs), job)
            status.set_phase("probing")
            job_dir = shard_dir / "jobs" / job
            job_dir.mkdir(parents=True)
            # The engine echoed its environment; the scrubber must catch it.
            (job_dir / "server.log").write_text(f"starting; HF_TOKEN={token_marker}\n")
            (job_dir / "summary.json").write_text("{}")
            (job_dir / "done").write_text("")
            uploader.upload_job(job)
            finished.append(job)
            if index == 2:
                imds.issue_spot_notice("terminate", in_s=120)
                assert interrupted.wait(5)
        watcher.stop()

    assert finished == jobs[:2]
    (shard_dir / "manifest.json").write_text(
        f'{{"instance_id": "{identity.instance_id}", "note": "{token_marker}"}}'
    )
    tarball = make_tarball(shard_dir, tmp_path / "results.tar.gz")
    uploader.upload_final(shard_dir / "manifest.json", tarball)
    assert uploader.close(timeout_s=30) == []
    assert status.close()

    # Everything finished is in S3, and the shard says interrupted.
    assert jobs_done_in_s3(CAMPAIGN, SHARD) == set(finished)
    ssm = boto3.client("ssm")
    name = status_parameter_name(CAMPAIGN, SHARD)
    final = ShardStatus.from_parameter_value(ssm.get_parameter(Name=name)["Parameter"]["Value"])
    assert final.phase == "interrupted" and final.market == "spot"
    assert final.instance_id == imds.instance_id
    assert final.results_uri == uploader.results_uri

    # The token marker is nowhere: logs, any status version, any object, the tarball.
    marker = token_marker.encode()
    assert token_marker not in caplog.text
    history = ssm.get_parameter_history(Name=name)["Parameters"]
    assert history
    for version in history:
        assert token_marker not in version["Value"]
        assert len(version["Value"].encode()) <= STATUS_MAX_BYTES
    s3 = boto3.client("s3")
    for obj in s3.list_objects_v2(Bucket=bucket)["Contents"]:
        assert marker not in s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            if member.isfile():
                assert marker not in tar.extractfile(member).read()  # type: ignore[union-attr]
    for path in shard_dir.rglob("*"):
        if path.is_file():
            assert marker not in path.read_bytes(), path
    assert token_marker not in os.environ.get("HF_TOKEN", "")
