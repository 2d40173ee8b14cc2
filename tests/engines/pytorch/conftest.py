"""Helpers for the PyTorch engine's server tests: its command line and start timeout (the
server behaviour both engines share runs from tests/engines/serving)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
HEALTH_TIMEOUT_S = 90.0
MAX_RUNNING = 64


def engine_argv(port: int, model: str, *flags: str) -> list[str]:
    """The engine's command line on 127.0.0.1:`port`."""
    return [sys.executable, "-m", "engines.pytorch", "--model", model, "--port", str(port), *flags]
