"""The end of an instance: power off (which the launch template turns into termination), and a
max-runtime watchdog that does it whatever happens.

Nothing may stay running (docs/DESIGN.md, "Rules"). The launch templates set "shutdown
behaviour: terminate", so an operating-system power-off ends the instance and its billing;
the user data also schedules a backstop power-off at boot. Here:

- `system_power_off(reason)`: `shutdown -h +0 <reason>` (a later shutdown replaces a pending
  one, so it also overrides the user data's backstop), then `systemctl poweroff` if that
  fails. The instance role has no EC2 permission at all (least privilege: no instance can end
  another), so powering off is the only way out; the user data's backstop remains;
- `default_power_off()`: the seam. It is `system_power_off` unless `BENCH_POWEROFF_FILE` names
  a file, in which case "powering off" appends the reason to that file: tests (and `bench
  run` on a workstation) run the real agent process without turning the machine off;
- `end_of_run(end_action, reason, power_off, delay_min)`: what the campaign's end action
  says (a failed run powers off after a grace period, so someone can look in over SSM);
- `MaxRuntimeWatchdog`: at the max runtime it calls `on_expire` (the runner publishes
  `failed`, drains uploads), waits at most `grace_s` for it, then powers off regardless.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

__all__ = [
    "POWEROFF_FILE_ENV",
    "EndAction",
    "MaxRuntimeWatchdog",
    "PowerOff",
    "default_power_off",
    "end_of_run",
    "system_power_off",
]

log = logging.getLogger(__name__)

POWEROFF_FILE_ENV = "BENCH_POWEROFF_FILE"
EndAction = Literal["terminate", "stay"]


class PowerOff(Protocol):
    """Power off now, or in `delay_min` minutes (a later call replaces a pending one)."""

    def __call__(self, reason: str, delay_min: int = 0) -> None: ...


# Tried in order until one succeeds: the systemd power-off paths on the DLAMI (Ubuntu).
# Each is (argv, whether the reason goes last as the wall message).
_POWEROFF_COMMANDS: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("shutdown", "-h", "+0"), True),
    (("systemctl", "poweroff"), False),
)
_COMMAND_TIMEOUT_S = 30.0


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        # Best effort, right before power-off.
        with contextlib.suppress(Exception):
            handler.flush()


def system_power_off(reason: str, delay_min: int = 0) -> None:
    """Power this machine off (terminating it, by the launch template's setting).

    Args:
        reason: a short text for the shutdown wall message and the log (no secrets).
        delay_min: minutes from now; 0 for at once.
    """
    log.warning("powering off in %d min: %s", delay_min, reason)
    _flush_logs()
    commands = _POWEROFF_COMMANDS
    if delay_min > 0:
        # Only shutdown can wait; systemctl poweroff is at once.
        commands = ((("shutdown", "-h", f"+{delay_min}"), True),)
    for argv, with_reason in commands:
        full = [*argv, reason] if with_reason else list(argv)
        try:
            subprocess.run(full, check=True, timeout=_COMMAND_TIMEOUT_S, capture_output=True)
            return
        except (OSError, subprocess.SubprocessError) as exc:
            log.error("power-off command %s failed: %s", argv[0], exc)
    log.error("could not power off; the user data's max-lifetime shutdown remains")


def _power_off_to_file(path: Path) -> PowerOff:
    def record(reason: str, delay_min: int = 0) -> None:
        log.warning("power-off (recorded in %s, machine left running): %s", path, reason)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(reason + (f" (in {delay_min} min)" if delay_min else "") + "\n")

    return record


def default_power_off() -> PowerOff:
    """The power-off to use: the real one, or a file record when `$BENCH_POWEROFF_FILE` is set."""
    target = os.environ.get(POWEROFF_FILE_ENV, "").strip()
    if target:
        return _power_off_to_file(Path(target))
    return system_power_off


def end_of_run(
    end_action: EndAction, reason: str, power_off: PowerOff, *, delay_min: int = 0
) -> bool:
    """Apply the campaign's end action; True if the machine was told to power off."""
    if end_action == "stay":
        log.info("end action 'stay': leaving the instance running (%s)", reason)
        return False
    power_off(reason, delay_min)
    return True


class MaxRuntimeWatchdog:
    """Powers off at `max_runtime_s` after `start()`, whatever the agent is doing.

    Args:
        max_runtime_s: seconds from start to power-off.
        power_off: the power-off seam (see `default_power_off`).
        on_expire: called first, on a separate thread (publish the status, drain uploads).
        grace_s: how long `on_expire` may take before the power-off goes ahead anyway.
    """

    def __init__(
        self,
        max_runtime_s: float,
        power_off: PowerOff,
        *,
        on_expire: Callable[[], None] | None = None,
        grace_s: float = 90.0,
    ) -> None:
        if max_runtime_s <= 0:
            raise ValueError(f"max_runtime_s must be positive, got {max_runtime_s}")
        self.max_runtime_s = max_runtime_s
        self.grace_s = grace_s
        self._power_off = power_off
        self._on_expire = on_expire
        self._cancel = threading.Event()
        self._expired = threading.Event()
        self._deadline: float | None = None
        self._thread: threading.Thread | None = None

    @property
    def expired(self) -> bool:
        return self._expired.is_set()

    @property
    def remaining_s(self) -> float | None:
        """Seconds left before power-off (None before start)."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def start(self) -> MaxRuntimeWatchdog:
        if self._thread is None:
            self._deadline = time.monotonic() + self.max_runtime_s
            self._thread = threading.Thread(target=self._run, name="max-runtime", daemon=True)
            self._thread.start()
        return self

    def cancel(self) -> None:
        """Stop watching (the run ended in time and applies its own end action)."""
        self._cancel.set()
        # Once expired the power-off goes ahead; do not wait for it (on_expire may call this).
        if self._thread is not None and not self._expired.is_set():
            self._thread.join(5)

    def _run(self) -> None:
        if self._cancel.wait(self.max_runtime_s):
            return
        self._expired.set()
        reason = f"bench max runtime ({self.max_runtime_s:.0f} s) reached"
        log.error("%s", reason)
        if self._on_expire is not None:
            done = threading.Event()

            def expire() -> None:
                try:
                    # Ignored below: checked not None above; mypy does not carry that into the
                    # closure.
                    self._on_expire()  # type: ignore[misc]
                except Exception:
                    log.exception("max runtime: on_expire failed")
                finally:
                    done.set()

            threading.Thread(target=expire, name="max-runtime-expire", daemon=True).start()
            if not done.wait(self.grace_s):
                log.error("max runtime: on_expire still running after %.0f s", self.grace_s)
        # Past the max runtime nothing cancels the power-off, not even end action "stay".
        self._power_off(reason)
