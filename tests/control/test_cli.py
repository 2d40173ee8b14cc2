"""`bench launch|status|fetch|cleanup` as a user runs them: the real console script in a
subprocess, against the moto server holding the real BenchStack."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from agent.campaigns import CAMPAIGNS_DIR, LOCAL_DEFAULT
from contract.layout import STACK_NAME, spec_key
from contract.spec import parse_campaign
from control.stack import StackOutputs
from tests.control.conftest import (
    live_instances,
    put_status,
    run_bench,
    tags_of,
    write_spec,
)
from tests.fixtures.moto_server import MotoServer


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_launch_relaunch_and_resume(stack: StackOutputs, tmp_path: Path):
    spec = write_spec(tmp_path / "c1.toml", "c1", [("s0", "g6.xlarge"), ("s1", "g6e.xlarge")])
    first = run_bench("launch", str(spec))
    assert first.returncode == 0, first.stderr
    for shard, type_ in (("s0", "g6.xlarge"), ("s1", "g6e.xlarge")):
        line = rf"{shard}: {stack.subnets_by_az['us-east-1a']} \(us-east-1a\) spot: ✅ launched"
        assert re.search(rf"{line} i-[0-9a-f]+ \({re.escape(type_)}\)", first.stdout)
    assert "bench cleanup" in first.stdout and "bench status c1" in first.stdout
    instances = {tags_of(i)["bench:shard"]: i for i in live_instances("c1")}
    assert sorted(instances) == ["s0", "s1"]
    assert instances["s1"]["InstanceType"] == "g6e.xlarge"
    s3 = boto3.client("s3")
    assert s3.get_object(Bucket=stack.bucket, Key=spec_key("c1"))["Body"].read() == (
        spec.read_bytes()
    )

    again = run_bench("launch", str(spec))
    assert again.returncode == 0, again.stderr
    assert "✅" not in again.stdout and again.stdout.count("already running") == 2
    assert len(live_instances("c1")) == 2

    boto3.client("ec2").terminate_instances(InstanceIds=[instances["s1"]["InstanceId"]])
    third = run_bench("launch", str(spec))
    assert third.returncode == 0, third.stderr
    assert "s1: " in third.stdout and "s0: subnet" not in third.stdout
    now = {tags_of(i)["bench:shard"]: i["InstanceId"] for i in live_instances("c1")}
    assert now["s0"] == instances["s0"]["InstanceId"]
    assert now["s1"] != instances["s1"]["InstanceId"]


@pytest.mark.parametrize("name", ["g6-six-engines", "t4-six-engines"])
def test_the_shipped_campaigns_launch_as_the_readme_says(stack: StackOutputs, name: str):
    spec = CAMPAIGNS_DIR / f"{name}.toml"
    result = run_bench("launch", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
    expected = {
        (s.name, s.instance_type) for s in parse_campaign(spec.read_text(), source=name).shards
    }
    launched = {(tags_of(i)["bench:shard"], i["InstanceType"]) for i in live_instances(name)}
    assert launched == expected


def test_the_local_campaign_is_refused(stack: StackOutputs):
    result = run_bench("launch", str(LOCAL_DEFAULT))
    assert result.returncode == 2 and "`bench launch` needs an EC2 type" in result.stderr
    assert live_instances() == []


def test_launch_wait_returns_when_the_agents_are_installing(stack: StackOutputs, tmp_path: Path):
    # The agent's first status is published before `bench launch` starts waiting, by a test
    # that cannot know the instance id yet: a record without one counts for any instance.
    put_status("w1", "s0", phase="installing")
    spec = write_spec(tmp_path / "w1.toml", "w1", [("s0", "g6.xlarge")])
    result = run_bench("launch", str(spec), "--wait", "--wait-timeout-min", "1")
    assert result.returncode == 0, result.stderr
    assert "s0: installing" in result.stdout and "ready" in result.stdout


def test_status_shows_each_shard_and_marks_a_stale_heartbeat(stack: StackOutputs, tmp_path: Path):
    spec = write_spec(
        tmp_path / "c2.toml", "c2", [("s0", "g6.xlarge"), ("s1", "g6.xlarge"), ("s2", "g6.xlarge")]
    )
    spec_only = write_spec(tmp_path / "c2b.toml", "c2", [("s0", "g6.xlarge"), ("s1", "g6.xlarge")])
    assert run_bench("launch", str(spec_only)).returncode == 0
    boto3.client("s3").put_object(Bucket=stack.bucket, Key=spec_key("c2"), Body=spec.read_bytes())
    ids = {tags_of(i)["bench:shard"]: i["InstanceId"] for i in live_instances("c2")}
    now = datetime.now(UTC)
    put_status(
        "c2",
        "s0",
        phase="sweeping",
        instance_id=ids["s0"],
        market="spot",
        job_index=2,
        jobs_total=5,
        current_job="vllm-d4/sweep",
        eta=now + timedelta(hours=1, minutes=30),
    )
    put_status(
        "c2",
        "s1",
        phase="probing",
        instance_id=ids["s1"],
        job_index=1,
        jobs_total=5,
        updated_at=now - timedelta(minutes=10),
        last_error="engine llama.cpp exited with 1",
    )
    boto3.client("ssm").put_parameter(Name="/bench/c2/zz", Value="{oops", Type="String")
    result = run_bench("status", "c2")
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    assert "sweeping" in rows["s0"] and "2/5" in rows["s0"] and "vllm-d4/sweep" in rows["s0"]
    assert "STALE" not in rows["s0"] and re.search(r"in 1h[23]\dm", rows["s0"])
    assert "probing (STALE)" in rows["s1"] and "10m ago" in rows["s1"]
    assert "engine llama.cpp exited with 1" in rows["s1"]
    assert "not launched" in rows["s2"]
    assert "status parameter malformed" in rows["zz"]

    everything = run_bench("status")
    assert everything.returncode == 0 and "Campaign c2" in everything.stdout


def test_status_watch_stops_when_every_shard_is_finished(stack: StackOutputs, tmp_path: Path):
    put_status("c3", "s0", phase="done")
    put_status("c3", "s1", phase="failed", last_error="out of memory")
    started = time.monotonic()
    result = run_bench("status", "c3", "--watch", "--interval", "0.2")
    assert result.returncode == 0, result.stderr
    assert "finished" in result.stdout and time.monotonic() - started < 30


def _shard_folder(shard: str, summary: bytes) -> dict[str, bytes]:
    manifest = json.dumps({"campaign": "c4", "shard": shard, "agent_version": "0.1.0"}).encode()
    return {
        "manifest.json": manifest,
        "agent.log": b"START\nEND\n",
        "jobs/j1/summary.json": summary,
        "jobs/j1/requests.jsonl": (b'{"request_id": "r"}\n' * 300_000)[: 6 * 2**20 + 123],
        "jobs/j1/done": b"",
    }


def _tarball(shard: str, files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{shard}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _upload_results(bucket: str, shard: str, files: dict[str, bytes], tarball: bytes) -> None:
    """As the agent does: job files one by one (the big one multipart), then the manifest and
    the tarball; one file with a SHA-256 checksum."""
    s3 = boto3.client("s3")
    prefix = f"results/c4/{shard}/"
    for name, data in files.items():
        key = prefix + name
        if name == "agent.log":
            continue  # only in the tarball, as the agent's log is
        if name.endswith("requests.jsonl"):
            upload = s3.create_multipart_upload(Bucket=bucket, Key=key)
            parts = []
            for number, start in enumerate(range(0, len(data), 5 * 2**20), start=1):
                part = s3.upload_part(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload["UploadId"],
                    PartNumber=number,
                    Body=data[start : start + 5 * 2**20],
                )
                parts.append({"PartNumber": number, "ETag": part["ETag"]})
            s3.complete_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=upload["UploadId"],
                MultipartUpload={"Parts": parts},
            )
        elif name.endswith("summary.json"):
            s3.put_object(Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256")
        else:
            s3.put_object(Bucket=bucket, Key=key, Body=data)
    s3.put_object(Bucket=bucket, Key=prefix + "results.tar.gz", Body=tarball)


def _mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_fetch_downloads_skips_resumes_and_verifies(stack: StackOutputs, tmp_path: Path):
    files = _shard_folder("s0", b'{"ok": true}')
    _upload_results(stack.bucket, "s0", files, _tarball("s0", files))
    dest = tmp_path / "out"

    first = run_bench("fetch", "c4", str(dest))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "files: 5 downloaded, 0 resumed, 0 skipped, 0 failed" in first.stdout
    assert "verified (5 files)" in first.stdout
    for name in ("jobs/j1/summary.json", "jobs/j1/requests.jsonl", "manifest.json"):
        assert (dest / "s0" / name).read_bytes() == files[name]
    before = _mtimes(dest)

    second = run_bench("fetch", "c4", str(dest))
    assert second.returncode == 0 and "0 downloaded, 0 resumed, 5 skipped" in second.stdout
    assert _mtimes(dest) == before

    # A corrupted file of the same size is fetched again; a half-done one resumes.
    summary = dest / "s0" / "jobs/j1/summary.json"
    summary.write_bytes(b'{"ok": fals}')
    big = dest / "s0" / "jobs/j1/requests.jsonl"
    etag = boto3.client("s3").head_object(
        Bucket=stack.bucket, Key="results/c4/s0/jobs/j1/requests.jsonl"
    )["ETag"]
    part = big.with_name(f"{big.name}.{hashlib.sha1(etag.encode()).hexdigest()[:12]}.part")
    part.write_bytes(files["jobs/j1/requests.jsonl"][: 3 * 2**20])
    big.unlink()
    third = run_bench("fetch", "c4", str(dest))
    assert third.returncode == 0, third.stdout + third.stderr
    assert "files: 1 downloaded, 1 resumed, 3 skipped, 0 failed" in third.stdout
    assert summary.read_bytes() == files["jobs/j1/summary.json"]
    assert big.read_bytes() == files["jobs/j1/requests.jsonl"] and not part.exists()


def test_fetch_reports_a_tarball_that_disagrees_with_the_uploads(
    stack: StackOutputs, tmp_path: Path
):
    files = _shard_folder("s1", b'{"ok": true}')
    packed = dict(files, **{"jobs/j1/summary.json": b'{"ok": false}'})
    _upload_results(stack.bucket, "s1", files, _tarball("s1", packed))
    result = run_bench("fetch", "c4", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "jobs/j1/summary.json: differs between the tarball and the uploaded file" in (
        result.stdout
    )


def test_fetch_of_a_campaign_without_results_yet(stack: StackOutputs, tmp_path: Path):
    boto3.client("s3").put_object(Bucket=stack.bucket, Key=spec_key("c5"), Body=b"x")
    result = run_bench("fetch", "c5", str(tmp_path / "out"))
    assert result.returncode == 0 and "no results yet" in result.stdout


def test_cleanup_asks_then_ends_finished_and_overdue_instances(stack: StackOutputs, tmp_path: Path):
    spec = write_spec(
        tmp_path / "c6.toml", "c6", [("s0", "g6.xlarge"), ("s1", "g6.xlarge"), ("s2", "g6.xlarge")]
    )
    other = write_spec(tmp_path / "c7.toml", "c7", [("s0", "g6.xlarge")])
    assert run_bench("launch", str(spec)).returncode == 0
    assert run_bench("launch", str(other)).returncode == 0
    ids = {tags_of(i)["bench:shard"]: i["InstanceId"] for i in live_instances("c6")}
    (working,) = [i["InstanceId"] for i in live_instances("c7")]
    put_status("c6", "s0", phase="done", instance_id=ids["s0"])
    put_status("c6", "s1", phase="sweeping", instance_id=ids["s1"])
    put_status("c7", "s0", phase="sweeping", instance_id=working)
    # s1 has outlived its campaign's max runtime (tagged at launch; 1 ms here).
    ec2 = boto3.client("ec2")
    ec2.create_tags(Resources=[ids["s1"]], Tags=[{"Key": "bench:max-runtime-h", "Value": "3e-7"}])
    ec2.create_tags(Resources=[ids["s2"]], Tags=[{"Key": "bench:max-runtime-h", "Value": "3e-7"}])

    declined = run_bench("cleanup", stdin="n\n")
    assert declined.returncode == 0, declined.stderr
    rows = {
        line.split("│")[1].strip(): line for line in declined.stdout.splitlines() if "│" in line
    }
    assert "terminate: shard done" in rows[ids["s0"]]
    assert "terminate: past max runtime" in rows[ids["s1"]]
    assert "terminate: past max runtime" in rows[ids["s2"]]
    assert "keep: sweeping" in rows[working] and "c7" in rows[working]
    assert "Terminate 3 instance(s) and delete 2 status parameter(s)? [y/N]" in declined.stdout
    assert "nothing done" in declined.stdout and len(live_instances()) == 4

    done = run_bench("cleanup", "--yes")
    assert done.returncode == 0, done.stderr
    assert [i["InstanceId"] for i in live_instances()] == [working]
    names = [
        p["Name"]
        for p in boto3.client("ssm").get_parameters_by_path(Path="/bench", Recursive=True)[
            "Parameters"
        ]
    ]
    assert names == ["/bench/c7/s0"]
    assert "deleted /bench/c6/s0" in done.stdout and "deleted /bench/c6/s1" in done.stdout
    assert "nothing to clean up" in run_bench("cleanup", "--yes").stdout


# --- bad input: one clear line each, exit status 2, nothing launched ---


def test_no_stack_deployed(aws: MotoServer, tmp_path: Path):
    spec = write_spec(tmp_path / "c.toml", "c", [("s0", "g6.xlarge")])
    result = run_bench("launch", str(spec))
    assert result.returncode == 2
    assert _one_line(result.stderr).startswith(
        f"bench launch: stack {STACK_NAME} not found in us-east-1: deploy it with `make deploy`"
    )
    assert live_instances() == []


def test_no_credentials(aws: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spec = write_spec(tmp_path / "c.toml", "c", [("s0", "g6.xlarge")])
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    result = run_bench("launch", str(spec))
    assert result.returncode == 2
    assert "no AWS credentials found" in _one_line(result.stderr)


@pytest.mark.parametrize(
    ("arms", "type_", "expected"),
    [
        (
            ("llama",),
            "g6",
            "shards.0.instance_type: instance_type 'g6' is not an EC2 type like g6.4xlarge",
        ),
        (("nonesuch",), "g6.xlarge", "shards.s0.arms.nonesuch: "),  # the recipe check
    ],
)
def test_a_spec_that_fails_validation(
    stack: StackOutputs, tmp_path: Path, arms: tuple[str, ...], type_: str, expected: str
):
    spec = write_spec(tmp_path / "bad.toml", "c", [("s0", type_)], arms=arms)
    result = run_bench("launch", str(spec))
    assert result.returncode == 2
    assert _one_line(result.stderr).startswith(f"bench launch: {spec}: {expected}")
    assert live_instances() == []
    assert boto3.client("s3").list_objects_v2(Bucket=stack.bucket).get("KeyCount", 0) == 0


def test_a_spec_that_is_not_toml(stack: StackOutputs, tmp_path: Path):
    spec = tmp_path / "bad.toml"
    spec.write_text("name = \n")
    result = run_bench("launch", str(spec))
    assert result.returncode == 2 and "not valid TOML" in _one_line(result.stderr)


@pytest.mark.parametrize("command", ["status", "fetch"])
def test_a_campaign_that_does_not_exist(stack: StackOutputs, tmp_path: Path, command: str):
    args = [command, "nope"] + ([str(tmp_path / "out")] if command == "fetch" else [])
    result = run_bench(*args)
    assert result.returncode == 2
    assert _one_line(result.stderr).startswith(f"bench {command}: campaign 'nope' not found")


def test_a_bucket_that_is_not_the_stacks(stack: StackOutputs, tmp_path: Path):
    boto3.client("s3").create_bucket(Bucket="someone-elses-bucket")
    spec = write_spec(tmp_path / "c.toml", "c", [("s0", "g6.xlarge")])
    result = run_bench("launch", str(spec), "--bucket", "someone-elses-bucket")
    assert result.returncode == 2
    assert _one_line(result.stderr) == (
        f"bench launch: --bucket someone-elses-bucket is not stack {STACK_NAME}'s results "
        f"bucket ({stack.bucket}); leave --bucket out to use the stack's"
    )
    assert live_instances() == []
    fetched = run_bench("fetch", "c", str(tmp_path / "o"), "--bucket", "someone-elses-bucket")
    assert fetched.returncode == 2 and "is not stack" in _one_line(fetched.stderr)


def test_status_after_cleanup_reads_the_uploads_and_shows_a_finished_shard_done(
    stack: StackOutputs, tmp_path: Path
):
    from contract.jobs import HostInfo, Manifest
    from contract.layout import results_prefix

    spec = write_spec(tmp_path / "c9.toml", "c9", [("s0", "g6.xlarge"), ("s1", "g6.xlarge")])
    assert run_bench("launch", str(spec)).returncode == 0
    ec2 = boto3.client("ec2")
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in live_instances("c9")])
    s3 = boto3.client("s3")
    manifest = Manifest(
        agent_version="0",
        git_sha=None,
        campaign=parse_campaign(spec.read_text()),
        shard="s0",
        host=HostInfo(hostname="h", os="linux", python="3", cpu="x", cpus=4, memory_mib=1),
        gpus=[],
        started_unix_s=1.0,
        finished_unix_s=2.0,
        jobs=["llama-probe"],
        jobs_ok=["llama-probe"],
    )
    for shard in ("s0", "s1"):
        key = results_prefix("c9", shard) + "jobs/llama-probe/done"
        s3.put_object(Bucket=stack.bucket, Key=key, Body=b"")
    s3.put_object(
        Bucket=stack.bucket,
        Key=results_prefix("c9", "s0") + "manifest.json",
        Body=manifest.model_dump_json().encode(),
    )
    # No status parameter: `bench cleanup` deleted them once no instance was left.
    result = run_bench("status", "c9")
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    assert "done" in rows["s0"] and "lost" not in rows["s0"], rows["s0"]
    assert "lost" in rows["s1"] and "1 job(s) done in S3" in rows["s1"], rows["s1"]
