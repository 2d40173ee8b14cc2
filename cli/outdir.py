"""What `--out` may hold before a run writes into it: nothing, or an earlier run resumed or
moved aside as the user chose. Runs are never mixed in one folder and nothing is deleted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from contract.errors import BenchError
from contract.jobs import MANIFEST_FILE
from contract.results import REQUESTS_FILE, SUMMARY_FILE

__all__ = [
    "OutFolderError",
    "OutMode",
    "holds_results",
    "move_aside",
    "nothing_left_unless_measured",
    "prepare_out",
]

OutMode = Literal["new", "resume", "overwrite"]
_RESULT_FILES = (SUMMARY_FILE, REQUESTS_FILE, MANIFEST_FILE)


class OutFolderError(BenchError, ValueError):
    """The results folder cannot be used as asked: one line for the user."""


def holds_results(folder: Path) -> bool:
    return folder.is_dir() and any((folder / name).exists() for name in _RESULT_FILES)


def move_aside(folder: Path) -> Path:
    """Rename `folder` to `<folder>.replaced-<time>` (a new name each time); return it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        target = folder.with_name(f"{folder.name}.replaced-{stamp}" + (f"-{n}" if n else ""))
        if not target.exists():
            folder.rename(target)
            return target
    raise OutFolderError(f"cannot find a free name to move {folder} aside")


def prepare_out(
    folder: Path, mode: OutMode, *, flag: str = "--out", resumable: bool = True
) -> Path | None:
    """Check `folder` for `mode`; for overwrite, move the old one aside and return where.

    `new` refuses a folder that holds results; `resume` needs one (the caller checks that
    its settings match); `overwrite` moves it aside, never deletes it. `resumable` False:
    the command has no --resume, and the refusal does not offer it.
    """
    held = holds_results(folder)
    if mode == "new" and held:
        offer = "add --resume to finish that run or " if resumable else "add "
        raise OutFolderError(
            f"{flag} {folder} already holds results; {offer}"
            "--overwrite to move it aside and start again"
        )
    if mode == "resume" and not held:
        raise OutFolderError(f"--resume: {folder} holds no results to resume")
    if mode == "overwrite" and folder.exists():
        return move_aside(folder)
    return None


@contextlib.contextmanager
def nothing_left_unless_measured(
    folder: Path, aside: Path | None, *, say: Callable[[str], None], unmeasured: tuple[str, ...]
) -> Iterator[None]:
    """Run the block that fills `folder`; if it fails before anything was measured (no
    summary, no request line), leave no folder behind and put back what `aside` holds.

    Only a folder the block created is removed, and only when it holds nothing but the
    `unmeasured` files (side files such as the server's /metrics readings) and empty ones.
    """
    created = not folder.exists()
    try:
        yield
    except BaseException:
        if created and not holds_results(folder):
            _remove(folder, unmeasured)
            if aside is not None and not folder.exists():
                aside.rename(folder)
                say(f"nothing measured: earlier results moved back to {folder}")
        raise


def _remove(folder: Path, unmeasured: tuple[str, ...]) -> None:
    for name in unmeasured:
        (folder / name).unlink(missing_ok=True)
    for path in folder.iterdir() if folder.is_dir() else ():
        if path.is_file() and path.stat().st_size == 0:  # opened, nothing written
            path.unlink()
    with contextlib.suppress(OSError):  # anything else in it: kept, and the folder with it
        folder.rmdir()
