"""The shard's tarball, and scrubbing secrets from every file before it leaves the machine.

Before any file is uploaded or archived, it is scrubbed in place of every secret value this
process has read (agent.aws.secrets): an engine that echoes its environment into server.log
must not put the HF token into S3 or the tarball. The uploader thread and the tarball may
reach one file together, so one scrubber runs at a time.
"""

from __future__ import annotations

import logging
import tarfile
import threading
from collections.abc import Iterable
from pathlib import Path

from agent.aws.secrets import known_secret_values, redact_bytes

__all__ = ["TEMP_SUFFIX", "files_under", "make_tarball", "scrub_secrets"]

log = logging.getLogger(__name__)

_SCAN_CHUNK = 8 << 20
TEMP_SUFFIX = ".bench-tmp"  # files being written here (scrubbed copies, tarball parts)
_scrub_lock = threading.Lock()


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
            tmp = path.with_name(path.name + TEMP_SUFFIX)
            tmp.write_bytes(redact_bytes(path.read_bytes()))
            tmp.replace(path)
            log.warning("a secret value was found in %s and replaced with ***", path)
            scrubbed.append(path)
    return scrubbed


def files_under(folder: Path) -> list[Path]:
    """Regular files under `folder`, without this module's own temporary files."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not p.is_symlink() and not p.name.endswith(TEMP_SUFFIX)
    )


def make_tarball(shard_dir: Path, dest: Path) -> Path:
    """`dest` (.tar.gz) holding `shard_dir` as one top folder, secrets scrubbed first.

    `dest` may lie inside `shard_dir`; it is not archived into itself. Stop writers (the
    telemetry sampler, the agent log) or flush them first: a file growing while archived is
    cut at the size it had when it was added.
    """
    files = [p for p in files_under(shard_dir) if p.resolve() != dest.resolve()]
    scrub_secrets(files)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + TEMP_SUFFIX)
    with tarfile.open(tmp, "w:gz") as tar:
        for path in files:
            if path.resolve() == tmp.resolve():
                continue
            tar.add(path, arcname=f"{shard_dir.name}/{path.relative_to(shard_dir).as_posix()}")
    tmp.replace(dest)
    log.info("tarball %s: %d files, %d bytes", dest, len(files), dest.stat().st_size)
    return dest
