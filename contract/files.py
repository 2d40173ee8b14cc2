"""File helpers every room uses, written once: a file's sha256, the last lines of a log, a
durable whole-file write, and an exclusive lock on a file shared between processes
(`filelock`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["LockTimeout", "locked", "sha256_file", "tail", "write_atomic"]

LockTimeout = Timeout  # raised by `locked` when the lock is still held after timeout_s
_BLOCK_BYTES = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read a megabyte at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def tail(path: Path, lines: int, *, unreadable: str = "") -> str:
    """The last `lines` lines of a text file (bytes that are not UTF-8 replaced);
    `unreadable` when the file cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return unreadable


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: written to a sibling, fsynced, then renamed over it, so a
    reader or a crash sees the old file or the new one, never a half of either."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


@contextlib.contextmanager
def locked(
    path: Path, timeout_s: float | None = None, *, on_wait: Callable[[], None] | None = None
) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created with its folder) for the block.

    Waits for another holder at most `timeout_s` (None: as long as it takes), calling
    `on_wait` once if it has to wait; raises `LockTimeout` when the wait runs out.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if on_wait is not None:
            on_wait()
        lock.acquire(timeout=-1 if timeout_s is None else timeout_s)
    try:
        yield
    finally:
        lock.release()
