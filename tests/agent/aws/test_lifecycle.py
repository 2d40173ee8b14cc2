"""Power-off seam, end actions and the max-runtime watchdog (nothing here powers off)."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest

from agent.aws import lifecycle
from agent.aws.lifecycle import (
    POWEROFF_FILE_ENV,
    MaxRuntimeWatchdog,
    default_power_off,
    end_of_run,
    system_power_off,
)


class Recorder:
    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.called = threading.Event()

    def __call__(self, reason: str, delay_min: int = 0) -> None:
        self.reasons.append(reason + (f" (in {delay_min} min)" if delay_min else ""))
        self.called.set()


def test_end_action_terminate_powers_off_stay_does_not():
    power_off = Recorder()
    assert not end_of_run("stay", "campaign done", power_off)
    assert power_off.reasons == []
    assert end_of_run("terminate", "campaign done", power_off)
    assert power_off.reasons == ["campaign done"]


def test_poweroff_file_seam(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    target = tmp_path / "poweroff"
    monkeypatch.setenv(POWEROFF_FILE_ENV, str(target))
    default_power_off()("campaign done")
    assert target.read_text() == "campaign done\n"


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_system_power_off_runs_shutdown_then_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Stand-ins for shutdown and systemctl, by absolute path: the real ones never run here.
    calls = tmp_path / "calls"
    ok = _script(tmp_path / "shutdown-ok", f'echo "shutdown $*" >> {calls}')
    bad = _script(tmp_path / "shutdown-bad", f'echo "bad $*" >> {calls}; exit 1')
    ctl = _script(tmp_path / "systemctl", f'echo "systemctl $*" >> {calls}')

    monkeypatch.setattr(
        lifecycle, "_POWEROFF_COMMANDS", (((ok, "-h", "+0"), True), ((ctl, "poweroff"), False))
    )
    system_power_off("bench done")
    assert calls.read_text() == "shutdown -h +0 bench done\n"

    calls.unlink()
    monkeypatch.setattr(
        lifecycle, "_POWEROFF_COMMANDS", (((bad, "-h", "+0"), True), ((ctl, "poweroff"), False))
    )
    system_power_off("bench done")
    assert calls.read_text() == "bad -h +0 bench done\nsystemctl poweroff\n"


def test_watchdog_calls_on_expire_then_powers_off():
    power_off, expired = Recorder(), threading.Event()
    watchdog = MaxRuntimeWatchdog(0.2, power_off, on_expire=expired.set, grace_s=5).start()
    assert expired.wait(5)
    assert power_off.called.wait(5)
    assert watchdog.expired
    assert "max runtime" in power_off.reasons[0]


def test_watchdog_powers_off_even_if_on_expire_hangs():
    power_off, release = Recorder(), threading.Event()
    started = time.monotonic()
    MaxRuntimeWatchdog(0.1, power_off, on_expire=lambda: release.wait(30), grace_s=0.3).start()
    assert power_off.called.wait(5)
    assert time.monotonic() - started < 3
    release.set()


def test_cancelled_watchdog_does_nothing():
    power_off = Recorder()
    watchdog = MaxRuntimeWatchdog(0.3, power_off).start()
    assert watchdog.remaining_s is not None and watchdog.remaining_s > 0
    watchdog.cancel()
    time.sleep(0.5)
    assert power_off.reasons == [] and not watchdog.expired


def test_a_failed_run_powers_off_after_the_grace_and_stay_still_stays():
    power_off = Recorder()
    assert end_of_run("terminate", "failed", power_off, delay_min=15)
    assert power_off.reasons == ["failed (in 15 min)"]
    assert not end_of_run("stay", "failed", power_off, delay_min=15)
    assert power_off.reasons == ["failed (in 15 min)"]


def test_a_delayed_system_power_off_schedules_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    calls = tmp_path / "calls"
    fake = _script(tmp_path / "shutdown", f'echo "shutdown $*" >> {calls}')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert Path(fake).name == "shutdown"
    system_power_off("bench failed", 15)
    assert calls.read_text() == "shutdown -h +15 bench failed\n"
