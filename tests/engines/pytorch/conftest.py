"""Fixtures for the PyTorch engine's tests: one real server on `random:tiny` (CPU), started
as a subprocess once per session and stopped at the end, and an HTTP client for it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.supervisor import EngineServer, free_port

REPO_ROOT = Path(__file__).resolve().parents[3]
HEALTH_TIMEOUT_S = 90.0
MAX_RUNNING = 64


def engine_argv(port: int, model: str, *flags: str) -> list[str]:
    """The engine's command line on 127.0.0.1:`port`."""
    return [sys.executable, "-m", "engines.pytorch", "--model", model, "--port", str(port), *flags]


@pytest.fixture(scope="session")
def pytorch_engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (no trailing slash) of the engine serving random:tiny on 127.0.0.1."""
    port = free_port()
    argv = engine_argv(port, "random:tiny", "--max-running", str(MAX_RUNNING), "--dtype", "auto")
    log_path = tmp_path_factory.mktemp("pytorch-engine") / "server.log"
    env = {"PYTHONPATH": str(REPO_ROOT)}
    with EngineServer(
        "pytorch", argv, log_path=log_path, port=port, env=env, cwd=REPO_ROOT
    ) as server:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", HEALTH_TIMEOUT_S)
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def client(pytorch_engine_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=pytorch_engine_url, timeout=60.0, trust_env=False) as c:
        yield c
