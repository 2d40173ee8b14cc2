"""Watching for the spot interruption notice, on its own thread.

EC2 posts the notice to `spot/instance-action` about two minutes before it stops or
terminates a spot instance; AWS suggests polling every 5 seconds. `SpotWatcher` polls IMDS
at that pace and calls `on_notice` once, from its own thread, then stops polling. The
callback should be quick or hand off: stop the current job, drain the uploader, publish
`interrupted` (the runner owns that sequence).

IMDS errors while polling are logged (once per outage) and polling goes on: a broken poll
must not end a campaign, and a notice that arrives later is still seen.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from agent.aws.imds import ImdsClient, ImdsError, SpotNotice

__all__ = ["DEFAULT_POLL_S", "SpotWatcher"]

log = logging.getLogger(__name__)

DEFAULT_POLL_S = 5.0


class SpotWatcher:
    """Polls IMDS for the interruption notice; calls `on_notice(notice)` once.

    Args:
        imds: the IMDS client (shared with the rest of the agent; it is thread-safe).
        on_notice: called once, from the watcher's thread, when a notice appears.
        poll_s: seconds between polls.
    """

    def __init__(
        self,
        imds: ImdsClient,
        on_notice: Callable[[SpotNotice], None],
        *,
        poll_s: float = DEFAULT_POLL_S,
    ) -> None:
        self._imds = imds
        self._on_notice = on_notice
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._notice: SpotNotice | None = None
        self.polls = 0

    @property
    def notice(self) -> SpotNotice | None:
        """The notice, once seen."""
        return self._notice

    def start(self) -> SpotWatcher:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="spot-watcher", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            self.polls += 1
            try:
                notice = self._imds.spot_notice()
            except ImdsError as exc:
                if not failing:
                    log.warning("spot watcher: IMDS poll failed (%s); still polling", exc)
                failing = True
                notice = None
            else:
                if failing:
                    log.info("spot watcher: IMDS answering again")
                failing = False
            if notice is not None:
                self._notice = notice
                log.warning(
                    "spot interruption notice: %s at %s",
                    notice.action,
                    notice.time.isoformat() if notice.time else "unknown time",
                )
                try:
                    self._on_notice(notice)
                except Exception:  # the runner's handler failing must not go unnoticed
                    log.exception("spot watcher: on_notice failed")
                return
            self._stop.wait(self.poll_s)
