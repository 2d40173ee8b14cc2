"""The llama.cpp build's steps and its log: how each command runs, and where its output goes.

Every command of the build (pip download, cmake configure, cmake build) runs with its output
appended to the build log between time-stamped START/END lines, in its own process group,
which is ended with it whatever stops the wait (a timeout, an exception, SIGTERM to the
builder), so no compiler outlives the build. `copy_log` hands the log (its tail when it is
huge) to the engine's install folder, from where the agent uploads it with the other logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from contract.errors import BenchError
from contract.files import LockTimeout, locked, tail
from contract.processes import end_process_group

__all__ = ["LlamaCppBuildError", "StepLog", "copy_log", "file_lock", "log_tail"]

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
# A build's log can run to megabytes (a CUDA build's thousands of lines; GCC's warnings on
# AVX-512 intrinsics in a native CPU build); past this its middle is dropped from the copy,
# which keeps the first LOG_COPY_HEAD_BYTES (the download, extract and configure steps: what
# the build was asked to do) and the rest from the end (the last steps, and any failure).
LOG_COPY_MAX_BYTES = 4 * 1024 * 1024
LOG_COPY_HEAD_BYTES = 64 * 1024


class LlamaCppBuildError(BenchError, RuntimeError):
    """A step of the llama.cpp build failed; the message carries the build log's tail."""


def log_tail(path: Path) -> str:
    return tail(path, LOG_TAIL_LINES, unreadable="(no log)")


class StepLog:
    """START/END lines with time stamps, to the logger and to the build log file."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path

    def _write(self, line: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        with self.log_path.open("a") as f:
            f.write(f"[{stamp}] {line}\n")
        log.info("%s", line)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        self._write(f"START {name}")
        t0 = time.monotonic()
        try:
            yield
        except BaseException:
            self._write(f"FAIL {name} {time.monotonic() - t0:.1f}s")
            raise
        self._write(f"END {name} {time.monotonic() - t0:.1f}s")

    def run(self, name: str, argv: list[str], *, timeout_s: float, cwd: Path | None = None) -> None:
        """Run one command with its output appended to the build log; raise with the tail."""
        with self.log_path.open("a") as out:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            try:
                process = subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own group: ending it reaches the compilers
                )
            except OSError as e:
                raise LlamaCppBuildError(
                    f"llama.cpp build step {name!r}: cannot run {argv[0]}: {e}"
                ) from e
            try:
                returncode = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired as e:
                raise LlamaCppBuildError(
                    f"llama.cpp build step {name!r} timed out after {timeout_s:.0f}s; "
                    f"last lines of {self.log_path}:\n{log_tail(self.log_path)}"
                ) from e
            finally:
                end_process_group(process)
        if returncode != 0:
            raise LlamaCppBuildError(
                f"llama.cpp build step {name!r} failed (exit {returncode}); "
                f"last lines of {self.log_path}:\n{log_tail(self.log_path)}"
            )


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """An exclusive lock, waited for at most timeout_s (another process may be building)."""

    def waiting() -> None:
        log.info("waiting for another process building in %s", path.parent)

    try:
        with locked(path, timeout_s, on_wait=waiting):
            yield
    except LockTimeout:
        raise LlamaCppBuildError(
            f"llama.cpp build lock {path} still held after {timeout_s:.0f}s"
        ) from None


def copy_log(source: Path | None, dest: Path, *, note: str = "") -> None:
    """Write the build log at `source` to `dest` (its head and tail, LOG_COPY_MAX_BYTES in
    all, when longer).

    `note` (what was built or reused) heads the copy; a missing log is said, not skipped,
    so the copy always tells what happened. Secrets are scrubbed where the agent uploads it.
    """
    head = [note] if note else []
    body = b""
    left_out = 0
    if source is None:
        head.append("no build log: the binary was not built here")
    else:
        try:
            with source.open("rb") as handle:
                size = handle.seek(0, os.SEEK_END)
                handle.seek(0)
                if size <= LOG_COPY_MAX_BYTES:
                    body = handle.read()
                else:
                    first = handle.read(LOG_COPY_HEAD_BYTES)
                    first = first[: first.rfind(b"\n") + 1]  # whole lines
                    handle.seek(size - (LOG_COPY_MAX_BYTES - LOG_COPY_HEAD_BYTES))
                    last = handle.read().split(b"\n", 1)[-1]
                    left_out = size - len(first) - len(last)
                    body = first + f"# ({left_out} bytes left out here)\n".encode() + last
        except OSError as e:
            head.append(f"build log {source} unreadable: {e}")
        else:
            head.append(f"build log {source}")
            if left_out:
                head.append(f"({left_out} bytes of its middle left out)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_bytes("".join(f"# {line}\n" for line in head).encode() + body)
    tmp.replace(dest)
