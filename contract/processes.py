"""Ending a child's whole process group, written once for every room that starts one.

Install steps, build commands and model downloads run in their own process group
(`start_new_session=True`) so that a stop reaches what they start in turn (cmake's compilers,
pip's build backends). Whatever ends the wait on such a child (it exits, a stop, a timeout,
an exception in the waiting process), `end_process_group` leaves nothing of its group
running: a leftover compiler or download would load the machine while later jobs measure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any

__all__ = ["TERM_GRACE_S", "end_process_group"]

TERM_GRACE_S = 10.0


def end_process_group(process: subprocess.Popen[Any], grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM the group of `process` (its leader) while the leader runs, wait up to grace_s,
    then SIGKILL whatever is left of the group; what the leader left behind after exiting
    is killed at once."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
