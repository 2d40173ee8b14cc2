"""Publishing the shard status to SSM: at every change, and as a heartbeat.

`StatusPublisher` holds the current `contract.status.ShardStatus` and one daemon thread that
writes it to the String parameter `/bench/<campaign>/<shard>` (Overwrite):

- when a caller changes it (`set_phase`, `set_job`, `set_error`, `set_uploads`), the thread
  publishes at once; the caller never waits on SSM, so a slow or broken SSM cannot stall a
  benchmark;
- otherwise every `heartbeat_s` (30 s by default; the contract asks for at least once a
  minute), with a fresh `updated_at`;
- a failed put is logged (once per outage, then at recovery) and retried with backoff, up
  to the heartbeat interval; it is never fatal;
- `close()` stops the thread after one last synchronous, bounded attempt, so a terminal
  phase reaches SSM before the instance powers off.

Every value is redacted of known secrets and cut to fit 4 KB (`ShardStatus.to_parameter_value`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from agent.aws.clients import ClientSettings, classify, describe, make_client
from agent.aws.secrets import redact
from contract.layout import status_parameter_name
from contract.status import STATUS_MAX_BYTES, TERMINAL_PHASES, Market, Phase, ShardStatus

__all__ = ["DEFAULT_HEARTBEAT_S", "StatusPublisher"]

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S = 30.0
# SSM calls from the publisher must end quickly: one botocore attempt, short timeouts; the
# publisher's own loop does the retrying.
_SSM_SETTINGS = ClientSettings(attempts=2, connect_timeout_s=3.0, read_timeout_s=5.0)
_FIRST_RETRY_S = 1.0
_FREE_TEXT = ("last_error", "upload_error", "current_job")


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class StatusPublisher:
    """The shard's status and its publisher thread.

    Args:
        campaign: campaign name.
        shard: shard name.
        instance_id: EC2 instance id (None off AWS).
        market: spot or on-demand (None off AWS).
        results_uri: where the results go, e.g. s3://bucket/results/<campaign>/<shard>/.
        heartbeat_s: seconds between heartbeats (at most 60 to keep the contract).
        client: an SSM client; default: one from the agent's factory.
        clock: returns the current UTC time (tests).
    """

    def __init__(
        self,
        campaign: str,
        shard: str,
        *,
        instance_id: str | None = None,
        market: Market | None = None,
        results_uri: str | None = None,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        client: Any | None = None,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        if not 0 < heartbeat_s <= 60:
            raise ValueError(f"heartbeat_s must be in (0, 60], got {heartbeat_s}")
        self.parameter_name = status_parameter_name(campaign, shard)
        self.heartbeat_s = heartbeat_s
        self._client = client or make_client("ssm", settings=_SSM_SETTINGS)
        self._clock = clock
        now = clock()
        self._status = ShardStatus(
            campaign=campaign,
            shard=shard,
            instance_id=instance_id,
            market=market,
            phase="booting",
            started_at=now,
            updated_at=now,
            results_uri=results_uri,
        )
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._version = 1  # bumped by each change
        self._published_version = 0
        self._job_started: tuple[int, float] | None = None  # (index, monotonic start)
        self._stopping = False
        self._failing_since: float | None = None
        self._thread: threading.Thread | None = None
        self.publish_count = 0  # successful puts (tests, logs)

    # --- reading ---

    @property
    def status(self) -> ShardStatus:
        with self._lock:
            return self._status

    # --- changing (never blocks on SSM) ---

    def _update(self, **changes: Any) -> None:
        with self._lock:
            self._status = self._status.model_copy(update=changes)
            self._version += 1
            self._changed.notify_all()

    def set_phase(self, phase: Phase, *, error: str | None = None) -> None:
        """Enter `phase` (published at once); `error` becomes last_error if given."""
        changes: dict[str, Any] = {"phase": phase}
        if error is not None:
            changes["last_error"] = error
        if phase in TERMINAL_PHASES:
            changes["eta"] = None
        log.info("status: phase %s", phase)
        self._update(**changes)

    def set_job(self, index: int, total: int, job: str, *, eta: datetime | None = None) -> None:
        """Job `index` (1-based) of `total` starts. Without `eta`, one is estimated from the
        mean duration of the jobs before it."""
        now_m = time.monotonic()
        # Counted from the first job this process started: a resumed shard skips the jobs
        # done before, which took no time here.
        if self._job_started is None:
            self._job_started = (index, now_m)
        first_index, first_start = self._job_started
        if eta is None and index > first_index:
            per_job = (now_m - first_start) / (index - first_index)
            eta = self._clock() + timedelta(seconds=round(per_job * (total - index + 1)))
        self._update(job_index=index, jobs_total=total, current_job=job, eta=eta)

    def set_error(self, error: str | None) -> None:
        """Record the latest failure (None clears it)."""
        self._update(last_error=error)

    def set_uploads(self, pending: int, error: str | None) -> None:
        """How many finished jobs wait on disk for S3, and why (the uploader's callback)."""
        self._update(uploads_pending=pending, upload_error=error)

    # --- publishing ---

    def start(self) -> StatusPublisher:
        """Start the publisher thread (it publishes the current status at once)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"status {self.parameter_name}", daemon=True
            )
            self._thread.start()
        return self

    def publish_now(self) -> bool:
        """Publish the current status from this thread; True if SSM took it."""
        with self._lock:
            version = self._version
            status = self._status.model_copy(update={"updated_at": self._clock()})
            self._status = status
        ok = self._put(status)
        if ok:
            with self._lock:
                self._published_version = max(self._published_version, version)
        return ok

    def _put(self, status: ShardStatus) -> bool:
        # Redact the free text before it is escaped into JSON, then the whole text again;
        # redaction only shortens ("***" is shorter than any registered value).
        clean = status.model_copy(
            update={f: redact(v) for f in _FREE_TEXT if (v := getattr(status, f)) is not None}
        )
        value = redact(clean.to_parameter_value())
        if len(value.encode()) > STATUS_MAX_BYTES:  # cannot happen; never worth a crash
            log.error("status: %d bytes after truncation; not published", len(value.encode()))
            return False
        try:
            self._client.put_parameter(
                Name=self.parameter_name, Value=value, Type="String", Overwrite=True
            )
        except Exception as exc:  # classified and logged; publishing is never fatal
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning(
                    "status: cannot publish %s (%s, %s); will keep trying",
                    self.parameter_name,
                    classify(exc).value,
                    describe(exc),
                )
            else:
                log.debug("status: publish still failing: %s", describe(exc))
            return False
        if self._failing_since is not None:
            log.info(
                "status: publishing again after %.0f s",
                time.monotonic() - self._failing_since,
            )
            self._failing_since = None
        self.publish_count += 1
        return True

    def _run(self) -> None:
        retry_s = _FIRST_RETRY_S
        next_beat = 0.0  # publish at once on start
        while True:
            with self._lock:
                while not self._stopping:
                    dirty = self._version != self._published_version
                    wait = next_beat - time.monotonic()
                    if (dirty and self._failing_since is None) or wait <= 0:
                        break
                    # A failing SSM is retried on the backoff clock, not on every change.
                    self._changed.wait(timeout=wait)
                if self._stopping:
                    return
            if self.publish_now():
                retry_s = _FIRST_RETRY_S
                next_beat = time.monotonic() + self.heartbeat_s
            else:
                next_beat = time.monotonic() + min(retry_s, self.heartbeat_s)
                retry_s = min(retry_s * 2, self.heartbeat_s)

    def close(self, *, attempts: int = 3, budget_s: float = 15.0) -> bool:
        """Stop the heartbeat, then publish the current status once more (bounded).

        Returns True if the last status reached SSM.
        """
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        deadline = time.monotonic() + budget_s
        delay = 0.5
        for attempt in range(1, attempts + 1):
            if self.publish_now():
                return True
            if attempt == attempts or time.monotonic() + delay > deadline:
                break
            time.sleep(delay)
            delay *= 2
        log.warning("status: last status of %s not published", self.parameter_name)
        return False
