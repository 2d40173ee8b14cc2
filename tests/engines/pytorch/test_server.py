"""The PyTorch engine's own server paths (the behaviour both engines share is in
tests/engines/serving/test_server_behaviour.py): the batched fast path served."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.engines.serving.test_server_behaviour import (
    PROMPTS,
    _chat,
    _concurrent_chat,
    _stream_many,
)

pytestmark = pytest.mark.slow


def test_fast_path_server_with_async_decode_streams_every_token(tmp_path: Any) -> None:
    """The batched path with the decode program and asynchronous decode, served (on CPU):
    greedy answers equal the synchronous server's, and 16 concurrent streams, greedy
    and sampled, each stream exactly the tokens their usage counts."""
    from agent.supervisor import EngineServer, free_port
    from tests.engines.pytorch.conftest import HEALTH_TIMEOUT_S, REPO_ROOT, engine_argv

    bodies = [
        {**_chat(p, max_tokens=24, temperature=0, ignore_eos=True), "model": "random:tiny-gemma4"}
        for p in PROMPTS[:4]
    ]
    answers = []
    for mode in ("off", "on"):
        port = free_port()
        argv = engine_argv(
            port, "random:tiny-gemma4", "--batch-invariant", "off", "--async-decode", mode
        )
        url = f"http://127.0.0.1:{port}"
        with EngineServer(
            "pytorch", argv, log_path=tmp_path / f"server-{mode}.log", port=port, cwd=REPO_ROOT
        ) as server:
            server.wait_healthy(f"{url}/health", HEALTH_TIMEOUT_S)
            answers.append(
                [
                    r["choices"][0]["message"]["content"]
                    for r in asyncio.run(_concurrent_chat(url, bodies))
                ]
            )
            if mode == "on":
                results = asyncio.run(_stream_many(url, 16, 24))
                for tokens, usage, done in results:
                    assert done and tokens == usage["completion_tokens"] == 24
    assert answers[0] == answers[1]
