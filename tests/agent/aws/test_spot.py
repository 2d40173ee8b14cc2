"""The spot watcher against the fake IMDS: the notice reaches the callback once."""

from __future__ import annotations

import threading
import time

from agent.aws.imds import ImdsClient, SpotNotice
from agent.aws.spot import SpotWatcher
from tests.fixtures.fake_imds import FakeImds


def test_notice_triggers_the_callback_once(imds: FakeImds):
    seen: list[SpotNotice] = []
    called = threading.Event()

    def on_notice(notice: SpotNotice) -> None:
        seen.append(notice)
        called.set()

    with ImdsClient(retry_delay_s=0.01) as client:
        watcher = SpotWatcher(client, on_notice, poll_s=0.05).start()
        try:
            time.sleep(0.3)
            assert not called.is_set()
            assert watcher.polls >= 3
            imds.issue_spot_notice("terminate", in_s=120)
            assert called.wait(5)
            time.sleep(0.3)  # more polls would call it again
        finally:
            watcher.stop()
    assert len(seen) == 1
    assert seen[0].action == "terminate"
    assert watcher.notice == seen[0]


def test_imds_errors_do_not_stop_the_watcher(imds: FakeImds):
    called = threading.Event()
    with ImdsClient(retry_delay_s=0.01, attempts=1) as client:
        watcher = SpotWatcher(client, lambda _: called.set(), poll_s=0.05)
        imds.fail_next(10, 503)
        watcher.start()
        try:
            time.sleep(0.3)
            imds.issue_spot_notice("stop")
            assert called.wait(5)
        finally:
            watcher.stop()


def test_a_failing_callback_is_logged_not_raised(imds: FakeImds, caplog):
    imds.issue_spot_notice()

    def broken(_: SpotNotice) -> None:
        raise RuntimeError("runner broke")

    with ImdsClient() as client:
        watcher = SpotWatcher(client, broken, poll_s=0.05).start()
        deadline = time.monotonic() + 5
        while watcher.notice is None and time.monotonic() < deadline:
            time.sleep(0.02)
        watcher.stop()
    assert "on_notice failed" in caplog.text
