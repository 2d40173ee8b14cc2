"""What a (re)launched instance fetches before it runs: the campaign spec, and the folders
of the jobs that S3 already holds done (so a relaunched shard resumes where S3 says, and its
final tarball holds the whole shard).

A job's `done` marker is uploaded after its other files (`agent.aws.uploader`), so `done` in
S3 means the whole folder is there; it is also restored last.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from agent.aws.bucket import UploadError, bucket_name
from agent.aws.clients import AwsCallError, ErrorKind, RetryPolicy, call_with_retry, make_client
from contract.files import write_atomic
from contract.layout import JOBS_DIR, job_prefix, results_prefix, spec_key
from contract.results import DONE_FILE

__all__ = ["download_spec", "jobs_done_in_s3", "restore_done_jobs"]

log = logging.getLogger(__name__)


def download_spec(
    campaign: str,
    dest: Path,
    *,
    bucket: str | None = None,
    client: Any | None = None,
    policy: RetryPolicy = RetryPolicy(budget_s=120.0),  # noqa: B008 - frozen
) -> Path:
    """Fetch `s3://<bucket>/campaigns/<campaign>/spec.toml` to `dest` (written atomically).

    Raises:
        UploadError: no such object, or S3 unreachable within the policy's budget.
    """
    bucket = bucket_name(bucket)
    key = spec_key(campaign)
    client = client or make_client("s3")
    uri = f"s3://{bucket}/{key}"
    try:
        response = call_with_retry(
            lambda: client.get_object(Bucket=bucket, Key=key), what=f"get {uri}", policy=policy
        )
        body = response["Body"].read()
    except AwsCallError as exc:
        if exc.kind is ErrorKind.NOT_FOUND:
            raise UploadError(
                f"campaign spec {uri} not found (was the campaign launched?)"
            ) from exc
        if exc.kind is ErrorKind.DENIED:
            # The role may list only the campaign prefixes, so S3 answers a missing key with
            # AccessDenied too: say both.
            raise UploadError(
                f"campaign spec {uri}: access denied, which is also how S3 answers for a spec "
                "that does not exist (was the campaign launched into this stack's bucket?)"
            ) from exc
        raise UploadError(f"cannot read campaign spec {uri}: {exc.detail}") from exc
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(dest, body)
    log.info("campaign spec %s -> %s (%d bytes)", uri, dest, len(body))
    return dest


def _list_keys(client: Any, bucket: str, prefix: str, policy: RetryPolicy) -> list[str]:
    def listing() -> list[str]:
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return keys

    return call_with_retry(listing, what=f"list s3://{bucket}/{prefix}", policy=policy)


def jobs_done_in_s3(
    campaign: str,
    shard: str,
    *,
    bucket: str | None = None,
    client: Any | None = None,
    policy: RetryPolicy = RetryPolicy(budget_s=120.0),  # noqa: B008 - frozen
) -> set[str]:
    """Jobs of this shard whose `done` marker is in S3 (so a relaunched shard skips them).

    Raises:
        UploadError: S3 unreachable within the policy's budget.
    """
    bucket = bucket_name(bucket)
    client = client or make_client("s3")
    prefix = f"{results_prefix(campaign, shard)}{JOBS_DIR}"
    try:
        keys = _list_keys(client, bucket, prefix, policy)
    except AwsCallError as exc:
        raise UploadError(f"cannot list finished jobs: {exc}") from exc
    done = set()
    for key in keys:
        parts = key[len(prefix) :].split("/")
        if len(parts) == 2 and parts[1] == DONE_FILE:
            done.add(parts[0])
    return done


def restore_done_jobs(
    campaign: str,
    shard: str,
    shard_dir: Path,
    *,
    bucket: str | None = None,
    client: Any | None = None,
    policy: RetryPolicy = RetryPolicy(budget_s=120.0),  # noqa: B008 - frozen
) -> set[str]:
    """Download the folders of jobs done in S3 into `shard_dir/jobs/`, `done` last.

    A relaunched shard then skips them like any local `done` job, and its final tarball holds
    the whole shard, not only what this instance ran. Jobs already done locally are left alone.

    Returns:
        The jobs that are done (in S3 or locally after this).

    Raises:
        UploadError: S3 unreachable within the policy's budget.
    """
    bucket = bucket_name(bucket)
    client = client or make_client("s3")
    done = jobs_done_in_s3(campaign, shard, bucket=bucket, client=client, policy=policy)
    for job in sorted(done):
        local = shard_dir / JOBS_DIR / job
        if (local / DONE_FILE).exists():
            continue
        prefix = job_prefix(campaign, shard, job)
        try:
            keys = _list_keys(client, bucket, prefix, policy)
            # `done` last, so a crash mid-restore leaves the job to run again, not half there.
            for key in sorted(keys, key=lambda k: k.endswith(f"/{DONE_FILE}")):
                target = local / key[len(prefix) :]
                target.parent.mkdir(parents=True, exist_ok=True)
                call_with_retry(
                    functools.partial(client.download_file, bucket, key, str(target)),
                    what=f"get s3://{bucket}/{key}",
                    policy=policy,
                )
        except AwsCallError as exc:
            raise UploadError(f"cannot restore job {job} from S3: {exc}") from exc
        log.info("job %s restored from s3://%s/%s", job, bucket, prefix)
    return done
