"""One job's folder, and the only writer of its files.

A campaign job (`jobs/<arm>-<item>/`) and a standalone `bench probe|sweep|eval` folder hold
the same files, named in `contract` and laid out in docs/DESIGN.md ("Results layout"):
`requests.jsonl` and the vLLM-format export, `answers.jsonl`, `summary.json`, `server.log`,
`job.json` and the `done` marker (and, in a standalone folder, `standalone.json`). The
measuring code hands this writer records; it decides where and how they land:

- lines (requests, answers, export runs) are appended, flushed and fsynced per batch, so a
  lost machine keeps every line measured;
- whole files (`summary.json`, `job.json`, `standalone.json`) are replaced atomically
  (`contract.files.write_atomic`);
- `done` comes last, after `job.json`, and only for a job that ended well: its presence is
  what a rerun skips and what an upload finishes with.

A resumed sweep first sets aside the lines of the cell that was in progress, so the folder
never holds two attempts at one cell. Any write that fails is a `ResultWriteError` naming
the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
from pydantic import BaseModel

from contract.errors import BenchError
from contract.evals import ANSWERS_FILE, AnswerRecord
from contract.files import tail, write_atomic
from contract.jobs import JOB_FILE, SERVER_LOG_FILE, JobRecord
from contract.results import (
    DONE_FILE,
    REQUESTS_FILE,
    SUMMARY_FILE,
    VLLM_EXPORT_FILE,
    RequestRecord,
)
from contract.standalone import STANDALONE_FILE, StandaloneManifest

__all__ = ["EARLIER_ATTEMPT_PREFIX", "INTERRUPTED_SUFFIX", "JobFolder", "ResultWriteError"]

# `requests.jsonl` -> `requests.interrupted.jsonl`: lines of cells a resume measures again.
INTERRUPTED_SUFFIX = ".interrupted"
# `jobs/<job>/earlier-<n>/`: what an unfinished attempt at a job left, before it is retried.
EARLIER_ATTEMPT_PREFIX = "earlier-"


class ResultWriteError(BenchError, OSError):
    """Results could not be written (disk full, permissions): one clear line, then stop."""


class JobFolder:
    """The files of one job folder at `path`: created now, or with `create=False` on the
    first write (so asking whether a job is done leaves no folder behind)."""

    def __init__(self, path: Path, *, create: bool = True) -> None:
        self.path = path
        self._made = False
        if create:
            self._make()

    # -- reading back what this folder holds -------------------------------------------

    @property
    def requests_path(self) -> Path:
        return self.path / REQUESTS_FILE

    @property
    def is_done(self) -> bool:
        return (self.path / DONE_FILE).exists()

    def record(self) -> JobRecord | None:
        """The job record an earlier run wrote; None when there is none.

        Raises ValueError (or OSError) when one is there but cannot be read.
        """
        path = self.path / JOB_FILE
        if not path.exists():
            return None
        return JobRecord.model_validate_json(path.read_bytes())

    def server_log_tail(self, lines: int) -> str:
        return tail(self.path / SERVER_LOG_FILE, lines)

    # -- lines, appended as they come ----------------------------------------------------

    def append_requests(self, records: Iterable[RequestRecord]) -> None:
        lines = b"".join(orjson.dumps(r.model_dump(exclude_none=True)) + b"\n" for r in records)
        self._append(self.requests_path, lines)

    def append_vllm_export(self, run: dict[str, object]) -> None:
        self._append(self.path / VLLM_EXPORT_FILE, orjson.dumps(run) + b"\n")

    def start_answers(self) -> None:
        """Begin `answers.jsonl` empty: an eval without `done` is asked again from the start."""
        self._write(self.path / ANSWERS_FILE, b"")

    def append_answer(self, record: AnswerRecord) -> None:
        self._append(self.path / ANSWERS_FILE, orjson.dumps(record.model_dump(mode="json")) + b"\n")

    def set_aside(self, name: str, keep: Callable[[dict[str, object]], bool]) -> int:
        """Move the lines of file `name` that `keep` rejects to its `.interrupted` sibling.

        Returns how many lines moved. Nothing is deleted: the moved lines are appended.
        """
        path = self.path / name
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
            self._write(path, b"".join(kept))
        return len(moved)

    def set_aside_earlier_attempt(self) -> Path | None:
        """Move what an earlier, unfinished attempt at this job left here into
        `earlier-<n>/` and return it, so a retried job's files are its own alone: its
        request lines never mixed with the earlier attempt's, and nothing deleted.
        """
        if not self.path.is_dir():
            return None
        left = [p for p in self.path.iterdir() if not p.name.startswith(EARLIER_ATTEMPT_PREFIX)]
        if not left:
            return None
        n = 1
        while (self.path / f"{EARLIER_ATTEMPT_PREFIX}{n}").exists():
            n += 1
        target = self.path / f"{EARLIER_ATTEMPT_PREFIX}{n}"
        try:
            target.mkdir()
            for path in left:
                path.rename(target / path.name)
        except OSError as exc:
            raise ResultWriteError(
                f"cannot set aside the earlier attempt in {self.path}: {exc}"
            ) from exc
        return target

    # -- whole files, replaced atomically --------------------------------------------------

    def write_summary(self, summary: BaseModel) -> Path:
        path = self.path / SUMMARY_FILE
        data = orjson.dumps(summary.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
        self._write(path, data)
        return path

    def write_standalone(self, manifest: StandaloneManifest) -> Path:
        """`standalone.json`: what a `bench probe|sweep|eval` folder measured, and how."""
        path = self.path / STANDALONE_FILE
        self._write(
            path, orjson.dumps(manifest.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
        )
        return path

    def remove_summary(self) -> None:
        """Drop an earlier run's summary before a job that rewrites it from the start."""
        try:
            (self.path / SUMMARY_FILE).unlink(missing_ok=True)
        except OSError as exc:
            raise ResultWriteError(f"cannot remove {self.path / SUMMARY_FILE}: {exc}") from exc

    def copy_server_log(self, source: Path, offset: int) -> None:
        """`server.log`: the part of the engine's whole log written during this job.

        A log that cannot be read leaves no copy: the job's record still says what happened.
        """
        try:
            with source.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
        except OSError:
            return
        self._write(self.path / SERVER_LOG_FILE, data)

    def finish(self, record: JobRecord) -> None:
        """Write `job.json`, then `done` when the job ended well (never before its record)."""
        self._write(self.path / JOB_FILE, record.model_dump_json(indent=2).encode())
        if record.status == "ok":
            self._write(self.path / DONE_FILE, b"")

    # -- the two ways a file is written ----------------------------------------------------

    def _make(self) -> None:
        if self._made:
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultWriteError(f"cannot create results folder {self.path}: {exc}") from exc
        self._made = True

    def _write(self, path: Path, data: bytes) -> None:
        self._make()
        try:
            write_atomic(path, data)
        except OSError as exc:
            raise ResultWriteError(f"cannot write {path}: {exc.strerror or exc}") from exc

    def _append(self, path: Path, data: bytes) -> None:
        self._make()
        try:
            with path.open("ab") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise ResultWriteError(f"cannot write {path}: {exc.strerror or exc}") from exc
