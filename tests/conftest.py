"""Session fixtures shared by the whole suite: a built llama-server, the tiny GGUF model, one
running llama-server serving it (started once, stopped at the end of the session), a moto
server, and BenchStack synthesized once (for the stack tests and the control plane's moto
stack)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.supervisor import EngineServer, free_port
from engines.builds.llamacpp import LlamaCppBuild, ensure_llama_server
from engines.models.tiny_gguf import write_tiny_gguf
from tests.fixtures.cdk_synth import synth_with
from tests.fixtures.llama_server import LLAMA_SERVER_HEALTH_TIMEOUT_S, llama_server_argv
from tests.fixtures.moto_server import MotoServer, moto_server

__all__ = ["synth_with"]  # a session fixture defined beside the synthesis code

# A cold llama.cpp build takes about 11 minutes on 2 cores, past pytest's 600 s per test;
# `make test` builds it before pytest starts, but a bare pytest run builds it in a fixture.
COLD_BUILD_TIMEOUT_S = 3600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give the first test that needs llama-server time for a cold build."""
    if not config.pluginmanager.hasplugin("timeout"):
        return
    for item in items:
        if "llama_server_build" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(COLD_BUILD_TIMEOUT_S))
            return


@pytest.fixture(scope="session")
def llama_server_build() -> LlamaCppBuild:
    """llama.cpp's CPU llama-server, built once into the cache (LLAMA_SERVER_BIN overrides)."""
    return ensure_llama_server()


@pytest.fixture(scope="session")
def tiny_gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf", seed=0)


@pytest.fixture(scope="session")
def llama_server_url(
    llama_server_build: LlamaCppBuild,
    tiny_gguf_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """Base URL (no trailing slash) of a running llama-server serving the tiny model."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("llama-server") / "server.log"
    argv = llama_server_argv(llama_server_build.binary, tiny_gguf_path, port)
    with EngineServer("llama.cpp", argv, log_path=log_path, port=port) as server:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", LLAMA_SERVER_HEALTH_TIMEOUT_S)
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    """One moto server for the session; tests that need a clean account call `.reset()`."""
    with moto_server() as server:
        yield server


@pytest.fixture
def aws(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """A clean moto account, with this process's boto3 pointed at it."""
    moto.reset()
    for key, value in moto.env().items():
        monkeypatch.setenv(key, value)
    return moto
