"""Running a test file as a child process with its own environment: Triton's interpreter
(`run`: `TRITON_INTERPRET=1` must be set before Triton is imported, and must not leak
into the other tests), or another driver (`child`, as `stub_cuda` runs it). The file is
the child's script, and its last line of output is its result as JSON. The child imports
from the repository's root (`benchmarks`, `tests`), which the installed package does not
hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def run(script: str, *args: str, timeout_s: int = 900) -> Any:
    """`script` (a test file's `__file__`) with `args` in the interpreter; its result."""
    return child(script, *args, env={"TRITON_INTERPRET": "1"}, timeout_s=timeout_s)


def child(script: str, *args: str, env: dict[str, str], timeout_s: int = 900) -> Any:
    """`script` with `args`, this process's environment updated by `env`; its result."""
    proc = subprocess.run(
        [sys.executable, script, *args],
        env={**os.environ, **env, "PYTHONPATH": _path()},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _path() -> str:
    inherited = os.environ.get("PYTHONPATH")
    return str(ROOT) if not inherited else os.pathsep.join((str(ROOT), inherited))
