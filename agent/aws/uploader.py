"""Results to S3 as they come: each finished job at once, the manifest and tarball at the end.

`ResultsUploader` owns one daemon thread and a FIFO queue. `upload_job` queues a job folder
and returns at once, so the benchmark goes on while it uploads; a lost instance loses at most
the job in progress. Each job's `done` marker is uploaded after its other files, so `done` in
S3 means the whole folder is there (what `agent.aws.restore` resumes from). When S3 fails,
the head of the queue is retried with exponential backoff (capped, with jitter) for as long
as the uploader runs; files stay on disk, nothing is dropped, already-uploaded files of a
job are not sent again, and the `on_backlog` callback (the status publisher's
`set_uploads`) says how many jobs wait and why. `drain(timeout_s)` waits, bounded, for the
queue to empty; `close()` drains and stops. Every file is scrubbed of secrets before it is
sent (`agent.aws.tarball.scrub_secrets`). Names and layout: `agent.aws.bucket`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.aws.bucket import UploadError, bucket_name, results_uri
from agent.aws.clients import classify, describe, make_client
from agent.aws.tarball import files_under, scrub_secrets
from contract.layout import JOBS_DIR, MANIFEST_FILE, TARBALL_FILE, job_prefix, results_prefix
from contract.results import DONE_FILE

__all__ = ["BacklogCallback", "Backoff", "ResultsUploader"]

log = logging.getLogger(__name__)

BacklogCallback = Callable[[int, str | None], None]
_SINGLE_PUT_MAX = 4 << 30  # S3 takes up to 5 GiB in one PUT; stay clear of it


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
        self.bucket = bucket_name(bucket)
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
        files = files_under(job_dir)
        # `done` last: in S3 it promises the rest of the folder is there.
        files.sort(key=lambda p: p.relative_to(job_dir).as_posix() == DONE_FILE)
        pairs = [(p, prefix + p.relative_to(job_dir).as_posix()) for p in files]
        self._enqueue(_Item(name=job, files=pairs))

    def upload_logs(self, logs_dir: Path) -> None:
        """Queue the files under `logs_dir` (a folder of the shard folder) as they lie there:
        the logs of a run that ends without a tarball (an interruption)."""
        rel = logs_dir.relative_to(self.shard_dir).as_posix()
        pairs = [
            (p, f"{self.prefix}{rel}/{p.relative_to(logs_dir).as_posix()}")
            for p in files_under(logs_dir)
        ]
        if pairs:
            self._enqueue(_Item(name=rel, files=pairs))

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
