"""Writing one job's results as they come: request lines appended and flushed per batch,
the summary replaced atomically after every cell, so a crash loses nothing measured. A
resumed sweep first sets aside the lines of the cell that was in progress, so the folder
never holds two attempts at one cell.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
from pydantic import BaseModel

from contract.errors import BenchError
from contract.results import REQUESTS_FILE, SUMMARY_FILE, VLLM_EXPORT_FILE, RequestRecord

__all__ = [
    "EARLIER_ATTEMPT_PREFIX",
    "INTERRUPTED_SUFFIX",
    "ResultWriteError",
    "ResultWriter",
    "set_aside_earlier_attempt",
]

# `requests.jsonl` -> `requests.interrupted.jsonl`: lines of cells a resume measures again.
INTERRUPTED_SUFFIX = ".interrupted"
# `jobs/<job>/earlier-<n>/`: what an unfinished attempt at a job left, before it is retried.
EARLIER_ATTEMPT_PREFIX = "earlier-"


class ResultWriteError(BenchError, OSError):
    """Results could not be written (disk full, permissions): one clear line, then stop."""


class ResultWriter:
    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultWriteError(f"cannot create results folder {job_dir}: {exc}") from exc

    @property
    def requests_path(self) -> Path:
        return self.job_dir / REQUESTS_FILE

    def append_requests(self, records: Iterable[RequestRecord]) -> None:
        lines = b"".join(orjson.dumps(r.model_dump(exclude_none=True)) + b"\n" for r in records)
        self._append(self.requests_path, lines)

    def append_vllm_export(self, run: dict[str, object]) -> None:
        self._append(self.job_dir / VLLM_EXPORT_FILE, orjson.dumps(run) + b"\n")

    def set_aside(self, name: str, keep: Callable[[dict[str, object]], bool]) -> int:
        """Move the lines of file `name` that `keep` rejects to its `.interrupted` sibling.

        Returns how many lines moved. Nothing is deleted: the moved lines are appended.
        """
        path = self.job_dir / name
        if not path.exists():
            return 0
        kept: list[bytes] = []
        moved: list[bytes] = []
        for line in path.read_bytes().splitlines(keepends=True):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                moved.append(line if line.endswith(b"\n") else line + b"\n")
                continue
            (kept if isinstance(row, dict) and keep(row) else moved).append(line)
        if moved:
            self._append(path.with_suffix(INTERRUPTED_SUFFIX + path.suffix), b"".join(moved))
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_bytes(b"".join(kept))
            tmp.replace(path)
        return len(moved)

    def write_summary(self, summary: BaseModel) -> Path:
        path = self.job_dir / SUMMARY_FILE
        tmp = path.with_suffix(".json.tmp")
        try:
            tmp.write_bytes(
                orjson.dumps(summary.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
            )
            tmp.replace(path)
        except OSError as exc:
            raise ResultWriteError(f"cannot write {path}: {exc.strerror or exc}") from exc
        return path

    def _append(self, path: Path, data: bytes) -> None:
        try:
            with path.open("ab") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise ResultWriteError(f"cannot write {path}: {exc.strerror or exc}") from exc


def set_aside_earlier_attempt(job_dir: Path) -> Path | None:
    """Move what an earlier, unfinished attempt at a job left in `job_dir` into
    `job_dir/earlier-<n>/` and return it, so a retried job's files are its own alone: its
    request lines never mixed with the earlier attempt's, and nothing deleted.
    """
    if not job_dir.is_dir():
        return None
    left = [p for p in job_dir.iterdir() if not p.name.startswith(EARLIER_ATTEMPT_PREFIX)]
    if not left:
        return None
    n = 1
    while (job_dir / f"{EARLIER_ATTEMPT_PREFIX}{n}").exists():
        n += 1
    target = job_dir / f"{EARLIER_ATTEMPT_PREFIX}{n}"
    try:
        target.mkdir()
        for path in left:
            path.rename(target / path.name)
    except OSError as exc:
        raise ResultWriteError(f"cannot set aside the earlier attempt in {job_dir}: {exc}") from exc
    return target
