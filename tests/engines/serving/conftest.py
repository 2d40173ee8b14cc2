"""Fixtures for the server behaviour suite: each engine (PyTorch on random:tiny, JAX on
random:tiny-gemma4, both CPU) started once as a real subprocess, and a client for it.
The suite runs once per engine (a parametrized session fixture)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from agent.supervisor import EngineServer, free_port

REPO_ROOT = Path(__file__).resolve().parents[3]
HEALTH_TIMEOUT_S = 300.0  # the JAX engine compiles its buckets before /health answers
MAX_RUNNING = 64


@dataclass(frozen=True)
class Served:
    """One engine under test: its URL, the model it serves, its metric prefix."""

    engine: str
    url: str
    model: str
    metric_prefix: str


def engine_argv(engine: str, port: int, model: str, *flags: str) -> list[str]:
    """The engine's command line on 127.0.0.1:`port`."""
    module = f"engines.{engine}"
    return [sys.executable, "-m", module, "--model", model, "--port", str(port), *flags]


# Each engine's tiny model and the flags that keep its start quick on a shared CPU host:
# the JAX engine compiles one prompt bucket, one KV bucket and decode batches of 1, 8, 64.
ENGINES: dict[str, tuple[str, tuple[str, ...]]] = {
    "pytorch": ("random:tiny", ("--dtype", "auto")),
    "jax": (
        "random:tiny-gemma4",
        (
            *("--device", "cpu", "--prefill-buckets", "64"),
            *("--kv-buckets", "4096", "--batch-buckets", "1,8"),
        ),
    ),
}


@pytest.fixture(scope="session", params=sorted(ENGINES))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    engine = str(request.param)
    model, flags = ENGINES[engine]
    port = free_port()
    argv = engine_argv(engine, port, model, "--max-running", str(MAX_RUNNING), *flags)
    log_path = tmp_path_factory.mktemp(f"{engine}-engine") / "server.log"
    env = {"PYTHONPATH": str(REPO_ROOT)}
    with EngineServer(engine, argv, log_path=log_path, port=port, env=env, cwd=REPO_ROOT) as server:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", HEALTH_TIMEOUT_S)
        yield Served(engine, f"http://127.0.0.1:{port}", model, f"{engine}_engine")


@pytest.fixture
def client(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=60.0, trust_env=False) as c:
        yield c
