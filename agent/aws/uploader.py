"""Results to S3: each finished job at once, the manifest and tarball at the end, resume, spec.

Layout (contract.layout): a shard's results live under `results/<campaign>/<shard>/` of the
results bucket (`$BENCH_BUCKET`): `jobs/<job>/<file>` for each job folder, then
`manifest.json` and `results.tar.gz` (the whole shard folder) at the end. The campaign spec
is `campaigns/<campaign>/spec.toml`.

`ResultsUploader` owns one daemon thread and a FIFO queue. `upload_job` queues a job folder
and returns at once, so the benchmark goes on while it uploads; a lost instance loses at most
the job in progress. Each job's `done` marker is uploaded after its other files, so `done` in
S3 means the whole folder is there (that is what `jobs_done_in_s3` lists, so a relaunched
shard resumes where S3 says). When S3 fails, the head of the queue is retried with
exponential backoff (capped, with jitter) for as long as the uploader runs; files stay on
disk, nothing is dropped, already-uploaded files of a job are not sent again, and the
`on_backlog` callback (the status publisher's `set_uploads`) says how many jobs wait and why.
`drain(timeout_s)` waits, bounded, for the queue to empty; `close()` drains and stops.

Before any file leaves the machine, it is scrubbed in place of every secret value this
process has read (agent.aws.secrets): an engine that echoes its environment into server.log
must not put the HF token into S3 or the tarball.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import tarfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.aws.clients import (
    AwsCallError,
    ErrorKind,
    RetryPolicy,
    call_with_retry,
    classify,
    describe,
    make_client,
)
from agent.aws.secrets import known_secret_values, redact_bytes
from contract.errors import BenchError
from contract.layout import (
    AGENT_ENV_BUCKET,
    JOBS_DIR,
    MANIFEST_FILE,
    TARBALL_FILE,
    job_prefix,
    results_prefix,
    spec_key,
)
from contract.results import DONE_FILE

__all__ = [
    "BacklogCallback",
    "Backoff",
    "ResultsUploader",
    "UploadError",
    "download_spec",
    "jobs_done_in_s3",
    "make_tarball",
    "restore_done_jobs",
    "results_uri",
    "scrub_secrets",
]

log = logging.getLogger(__name__)

BacklogCallback = Callable[[int, str | None], None]
_SCAN_CHUNK = 8 << 20
_SINGLE_PUT_MAX = 4 << 30  # S3 takes up to 5 GiB in one PUT; stay clear of it
_TEMP_SUFFIX = ".bench-tmp"  # files this module is writing (scrubbed copies, tarball parts)
_scrub_lock = threading.Lock()


class UploadError(BenchError, RuntimeError):
    """A results or spec transfer failed for good; the message names the object."""


def _bucket(bucket: str | None) -> str:
    name = bucket or os.environ.get(AGENT_ENV_BUCKET, "").strip()
    if not name:
        raise UploadError(f"no results bucket: ${AGENT_ENV_BUCKET} is not set")
    return name


def results_uri(campaign: str, shard: str, bucket: str | None = None) -> str:
    """`s3://<bucket>/results/<campaign>/<shard>/`: where a shard's results go."""
    return f"s3://{_bucket(bucket)}/{results_prefix(campaign, shard)}"


# --- scrubbing ---


def _contains(path: Path, needles: Iterable[bytes]) -> bool:
    needles = [n for n in needles if n]
    if not needles:
        return False
    overlap = max(len(n) for n in needles) - 1
    tail = b""
    with path.open("rb") as handle:
        while chunk := handle.read(_SCAN_CHUNK):
            window = tail + chunk
            if any(n in window for n in needles):
                return True
            tail = window[-overlap:] if overlap else b""
    return False


def scrub_secrets(paths: Iterable[Path]) -> list[Path]:
    """Replace every known secret value in these files with ***, in place (atomically).

    Returns the files that held one (logged by name, never by value).
    """
    needles = [value.encode() for value in known_secret_values()]
    scrubbed: list[Path] = []
    if not needles:
        return scrubbed
    # One scrubber at a time: the uploader thread and the tarball may reach a file together.
    with _scrub_lock:
        for path in paths:
            if not path.is_file() or not _contains(path, needles):
                continue
            tmp = path.with_name(path.name + _TEMP_SUFFIX)
            tmp.write_bytes(redact_bytes(path.read_bytes()))
            tmp.replace(path)
            log.warning("a secret value was found in %s and replaced with ***", path)
            scrubbed.append(path)
    return scrubbed


def _files_under(folder: Path) -> list[Path]:
    """Regular files under `folder`, without this module's own temporary files."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not p.is_symlink() and not p.name.endswith(_TEMP_SUFFIX)
    )


# --- one-shot operations (spec, resume, tarball) ---


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
    bucket = _bucket(bucket)
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
    tmp = dest.with_name(dest.name + _TEMP_SUFFIX)
    tmp.write_bytes(body)
    tmp.replace(dest)
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
    bucket = _bucket(bucket)
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
    bucket = _bucket(bucket)
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


def make_tarball(shard_dir: Path, dest: Path) -> Path:
    """`dest` (.tar.gz) holding `shard_dir` as one top folder, secrets scrubbed first.

    `dest` may lie inside `shard_dir`; it is not archived into itself. Stop writers (the
    telemetry sampler, the agent log) or flush them first: a file growing while archived is
    cut at the size it had when it was added.
    """
    files = [p for p in _files_under(shard_dir) if p.resolve() != dest.resolve()]
    scrub_secrets(files)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + _TEMP_SUFFIX)
    with tarfile.open(tmp, "w:gz") as tar:
        for path in files:
            if path.resolve() == tmp.resolve():
                continue
            tar.add(path, arcname=f"{shard_dir.name}/{path.relative_to(shard_dir).as_posix()}")
    tmp.replace(dest)
    log.info("tarball %s: %d files, %d bytes", dest, len(files), dest.stat().st_size)
    return dest


# --- the uploader thread ---


@dataclass
class _Item:
    """One queued upload: a job folder, or one end-of-run file."""

    name: str  # what the status and logs call it: the job id, or the file name
    files: list[tuple[Path, str]]  # (local file, key), in upload order
    sent: set[str] = field(default_factory=set)  # keys uploaded already
    first_failure: float | None = None


@dataclass(frozen=True)
class Backoff:
    """Retry timing of the uploader's queue head: exponential, capped, with jitter."""

    base_s: float = 1.0
    max_s: float = 60.0

    def delay(self, failures: int) -> float:
        # The exponent is clamped: hours of failures must not overflow a float.
        cap = min(self.max_s, self.base_s * 2 ** min(failures - 1, 30))
        return random.uniform(cap / 2, cap)


class ResultsUploader:
    """Uploads a shard's results from one background thread; see the module docstring.

    Args:
        campaign: campaign name.
        shard: shard name.
        shard_dir: the local shard folder (holds `jobs/<job>/`, manifest, tarball).
        bucket: results bucket; default `$BENCH_BUCKET`.
        client: an S3 client; default: one from the agent's factory.
        backoff: retry timing while S3 fails.
        on_backlog: called with (jobs waiting, why) when uploads start failing, when the
            count changes while failing, and with (0, None) when they recover.
    """

    def __init__(
        self,
        campaign: str,
        shard: str,
        shard_dir: Path,
        *,
        bucket: str | None = None,
        client: Any | None = None,
        backoff: Backoff = Backoff(),
        on_backlog: BacklogCallback | None = None,
    ) -> None:
        self.campaign = campaign
        self.shard = shard
        self.shard_dir = shard_dir
        self.bucket = _bucket(bucket)
        self.prefix = results_prefix(campaign, shard)
        self.backoff = backoff
        self._client = client or make_client("s3")
        self._on_backlog = on_backlog
        self._cond = threading.Condition()
        self._queue: list[_Item] = []
        self._busy = False  # the worker holds an item outside the lock
        self._failures = 0
        self._next_try = 0.0
        self._last_error: str | None = None
        self._reported: tuple[int, str | None] = (0, None)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.uploaded_keys: list[str] = []  # in upload order (logs, tests)

    @property
    def results_uri(self) -> str:
        return results_uri(self.campaign, self.shard, self.bucket)

    # --- queueing (never blocks on S3) ---

    def start(self) -> ResultsUploader:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="uploader", daemon=True)
            self._thread.start()
        return self

    def upload_job(self, job: str, job_dir: Path | None = None) -> None:
        """Queue a job folder (default `shard_dir/jobs/<job>`); `done` goes last."""
        job_dir = job_dir or self.shard_dir / JOBS_DIR / job
        prefix = job_prefix(self.campaign, self.shard, job)
        if not job_dir.is_dir():
            log.warning("upload: job folder %s does not exist; nothing to upload", job_dir)
            return
        files = _files_under(job_dir)
        # `done` last: in S3 it promises the rest of the folder is there.
        files.sort(key=lambda p: p.relative_to(job_dir).as_posix() == DONE_FILE)
        pairs = [(p, prefix + p.relative_to(job_dir).as_posix()) for p in files]
        self._enqueue(_Item(name=job, files=pairs))

    def upload_final(self, manifest: Path, tarball: Path) -> None:
        """Queue the manifest and the tarball (after every job queued so far)."""
        self._enqueue(_Item(name=MANIFEST_FILE, files=[(manifest, self.prefix + MANIFEST_FILE)]))
        self._enqueue(_Item(name=TARBALL_FILE, files=[(tarball, self.prefix + TARBALL_FILE)]))

    def _enqueue(self, item: _Item) -> None:
        with self._cond:
            if self._stopping:
                raise UploadError(f"uploader closed; {item.name} not queued")
            # A job queued again (rerun after a failure) replaces its older entry.
            self._queue = [q for q in self._queue if q.name != item.name or q is self._head()]
            self._queue.append(item)
            self._cond.notify_all()
        self._report()

    def _head(self) -> _Item | None:
        return self._queue[0] if self._busy and self._queue else None

    @property
    def pending(self) -> list[str]:
        """Names of the items not uploaded yet (jobs, then end-of-run files)."""
        with self._cond:
            return [item.name for item in self._queue]

    def drain(self, timeout_s: float) -> list[str]:
        """Wait until the queue is empty or `timeout_s` passes; returns what is still pending.

        While draining, a failing head is retried at once rather than after its backoff.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._next_try = 0.0
            self._cond.notify_all()
            while self._queue:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    break
                self._cond.wait(timeout=min(left, 0.5))
            return [item.name for item in self._queue]

    def close(self, timeout_s: float = 60.0) -> list[str]:
        """Drain (bounded), then stop the thread; returns what stayed on disk only."""
        left = self.drain(timeout_s)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if left:
            log.warning(
                "uploads not done, files stay in %s: %s (%s)",
                self.shard_dir,
                ", ".join(left),
                self._last_error,
            )
        return left

    # --- the worker ---

    def _report(self) -> None:
        """Tell on_backlog when the failing state or the waiting count changes."""
        with self._cond:
            state = (len(self._queue), self._last_error) if self._failures else (0, None)
            if state == self._reported:
                return
            self._reported = state
        if self._on_backlog is not None:
            try:
                self._on_backlog(*state)
            except Exception:  # a broken callback must not stop uploads
                log.exception("uploader: backlog callback failed")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (not self._queue or time.monotonic() < self._next_try):
                    wait = self._next_try - time.monotonic() if self._queue else None
                    self._cond.wait(timeout=wait)
                if self._stopping:
                    return
                item = self._queue[0]
                self._busy = True
            error = self._send(item)
            with self._cond:
                self._busy = False
                if error is None:
                    self._queue.remove(item)
                    if self._failures:
                        log.info("uploads recovered; %d item(s) left", len(self._queue))
                    self._failures = 0
                    self._last_error = None
                    self._next_try = 0.0
                else:
                    self._failures += 1
                    self._last_error = error
                    delay = self.backoff.delay(self._failures)
                    self._next_try = time.monotonic() + delay
                    if item.first_failure is None:
                        item.first_failure = time.monotonic()
                    log.warning(
                        "upload of %s failed (%s); %d item(s) wait on disk, retry in %.1f s",
                        item.name,
                        error,
                        len(self._queue),
                        delay,
                    )
                self._cond.notify_all()
            self._report()

    def _send(self, item: _Item) -> str | None:
        """Upload the item's files not sent yet, in order; None on success, else why not."""
        scrub_secrets(path for path, key in item.files if key not in item.sent)
        for path, key in item.files:
            if key in item.sent:
                continue
            try:
                if path.stat().st_size > _SINGLE_PUT_MAX:
                    # Past S3's single-PUT limit: s3transfer's multipart upload.
                    self._client.upload_file(str(path), self.bucket, key)
                else:
                    with path.open("rb") as body:
                        self._client.put_object(Bucket=self.bucket, Key=key, Body=body)
            except FileNotFoundError:
                # Deleted after it was queued (e.g. a temp file): nothing left to keep.
                log.warning("upload: %s vanished before upload; skipped", path)
                item.sent.add(key)
                continue
            except Exception as exc:  # classified; the item stays queued whatever it was
                return f"{classify(exc).value}: {describe(exc)}"
            item.sent.add(key)
            self.uploaded_keys.append(key)
        started = item.first_failure
        log.info(
            "uploaded %s (%d files) to s3://%s/%s%s",
            item.name,
            len(item.files),
            self.bucket,
            self.prefix,
            f" after {time.monotonic() - started:.0f} s of failures" if started else "",
        )
        return None
