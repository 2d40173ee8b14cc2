"""llama.cpp's real `llama-server` accepts every argv the recipe renders (a dry parse).

Each rendered argv is started on the tiny GGUF with the CPU build from tests/conftest.py.
The GPU variants' flags (all layers offloaded, flash attention, one KV pool for 64 slots)
parse on a CPU build too, so those start and get healthy as well. A drafter arm's default
type (draft-mtp, for Gemma 4's assistant) needs a drafter with MTP layers, which the tiny
model has not: there the check is that the parser took every flag and the server went on
to load the draft model; with the type overridden to a plain draft model, the tiny model
drafts for itself and the server gets healthy and ready. A bogus flag shows the check can
tell a rejection from an acceptance.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent.readiness import wait_ready_sync
from agent.supervisor import EngineServer, free_port
from engines.builds.llamacpp import LlamaCppBuild
from engines.recipes import get_recipe, render
from engines.recipes.render import RenderedServe

pytestmark = pytest.mark.slow

RECIPE = get_recipe("llamacpp")
PARSE_ERRORS = ("error: invalid argument", "error while handling argument")
PARSED = "load_model: loading model"
HEALTH_TIMEOUT_S = 60.0


def _parse(argv: tuple[str, ...] | list[str], timeout_s: float = 60.0) -> tuple[bool, str]:
    """(accepted, output): run until the server has parsed its flags (or exited)."""
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    rejected = any(marker in out for marker in PARSE_ERRORS)
    return (not rejected and PARSED in out), out


def _serve_and_ready(served: RenderedServe, tmp_path: Path) -> None:
    log_path = tmp_path / f"{served.arm}-{served.variant}.log"
    with EngineServer(served.engine, served.argv, log_path=log_path, port=served.port) as server:
        server.wait_healthy(served.health_url, HEALTH_TIMEOUT_S)
        result = wait_ready_sync(
            served.base_url,
            engine=served.engine,
            timeout_s=60.0,
            settings=served.request_settings(),
            health_s=server.health_s,
            alive=lambda: server.running,
        )
    assert result.ok, result
    assert result.health_s is not None and result.first_completion_s is not None
    assert "error" not in log_path.read_text().lower().split("load_model")[0]


@pytest.mark.parametrize("gpu", [None, "7.5", "8.9", "9.0"])
def test_plain_arm_parses_and_serves(
    gpu: str | None, llama_server_build: LlamaCppBuild, tiny_gguf_path: Path, tmp_path: Path
):
    served = render(
        RECIPE, "llama", gpu, tiny_gguf_path, free_port(), binary=llama_server_build.binary
    )
    _serve_and_ready(served, tmp_path)


@pytest.mark.parametrize("tokens", [1, 2, 4])
def test_drafter_arm_flags_parse_and_reach_the_draft_model(
    tokens: int, llama_server_build: LlamaCppBuild, tiny_gguf_path: Path
):
    served = render(
        RECIPE,
        f"llama-d{tokens}",
        "8.9",
        tiny_gguf_path,
        free_port(),
        binary=llama_server_build.binary,
        drafter=tiny_gguf_path,
    )
    assert "--spec-type" in served.argv and "draft-mtp" in served.argv
    accepted, out = _parse(served.argv)
    assert accepted, out[-3000:]
    assert "loading draft model" in out, out[-3000:]


def test_drafter_arm_serves_with_a_plain_draft_model(
    llama_server_build: LlamaCppBuild, tiny_gguf_path: Path, tmp_path: Path
):
    served = render(
        RECIPE,
        "llama-d2",
        None,
        tiny_gguf_path,
        free_port(),
        binary=llama_server_build.binary,
        drafter=tiny_gguf_path,
        settings={"spec_type": "draft-simple"},
    )
    _serve_and_ready(served, tmp_path)


def test_the_check_tells_a_rejected_flag(llama_server_build: LlamaCppBuild, tiny_gguf_path: Path):
    served = render(
        RECIPE, "llama", None, tiny_gguf_path, free_port(), binary=llama_server_build.binary
    )
    accepted, out = _parse([*served.argv, "--no-such-flag", "1"])
    assert not accepted and "invalid argument" in out
    with_bad_value = render(
        RECIPE, "llama", "8.9", tiny_gguf_path, free_port(),
        binary=llama_server_build.binary, settings={"n_gpu_layers": "lots"},
    )  # fmt: skip
    accepted, out = _parse(with_bad_value.argv)
    assert not accepted and "error while handling argument" in out
