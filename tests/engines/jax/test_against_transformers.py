"""The JAX engine against transformers: a tiny Gemma 4 text model saved as a Hugging Face
folder by transformers, served by `python -m engines.jax` (CPU, float32); its greedy
continuations through /v1/completions equal transformers' `generate()` token for token,
one request at a time and all at once (also with rows that end inside a multi-step call),
for prompts longer than the sliding window (the ring wraps) and longer than the prompt
chunk (prefill runs in pieces). Every bucket is compiled before /health answers, and
/metrics says how many."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.supervisor import EngineServer, free_port
from engines.serving.random_models import RANDOM_MODELS
from engines.serving.tokenizer import build_byte_tokenizer, stop_token_ids
from tests.engines.serving.conftest import HEALTH_TIMEOUT_S, REPO_ROOT, engine_argv

pytestmark = pytest.mark.slow

NEW_TOKENS = 24
PROMPTS = [
    "The capital of France is Paris, and",  # 36 tokens
    "def fibonacci(n): return n if n < 2 else",  # longer than the window (16)
    "Once upon a time, in a kingdom by the sea, there lived a girl whose name was",  # 3 chunks
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,",
]
# Prompt buckets of 8 and 32 (longer prompts prefill in chunks), one KV bucket, decode
# batches of 1 and 8, each one step a call and 8 greedy steps a call (the default): six
# programs, so the compile stays short on a shared CPU.
FLAGS = ("--device", "cpu", "--dtype", "float32", "--prefill-buckets", "8,32")
FLAGS += ("--kv-buckets", "256", "--max-model-len", "256", "--max-running", "8")


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = build_byte_tokenizer()
    config = RANDOM_MODELS["tiny-gemma4"].build_config(tokenizer)
    config.initializer_range = 0.05  # text that varies with the context
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=stop_token_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
    )
    folder = tmp_path_factory.mktemp("tiny-gemma4-hf")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def jax_url(
    tiny_gemma: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    folder, _ = tiny_gemma
    port = free_port()
    log_path = tmp_path_factory.mktemp("jax-engine") / "server.log"
    argv = engine_argv("jax", port, str(folder), *FLAGS)
    env = {"PYTHONPATH": str(REPO_ROOT)}
    with EngineServer("jax", argv, log_path=log_path, port=port, env=env, cwd=REPO_ROOT) as server:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", HEALTH_TIMEOUT_S)
        log = log_path.read_text()
        assert "compiled all 6 buckets" in log, log
        yield f"http://127.0.0.1:{port}"


def _body(ids: list[int]) -> dict[str, Any]:
    return {
        "prompt": ids,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "skip_special_tokens": False,
    }


def test_greedy_equals_transformers_generate(
    tiny_gemma: tuple[Path, Any], jax_url: str
) -> None:
    import torch

    _, model = tiny_gemma
    tokenizer = build_byte_tokenizer()
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    assert min(len(p) for p in prompts) >= 20
    assert max(len(p) for p in prompts) > 64  # more than two chunks of 32
    expected = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(
                torch.tensor([ids]),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,  # EOS banned, as ignore_eos does
                do_sample=False,
            )[0, len(ids) :].tolist()
            expected.append(tokenizer.decode(out, skip_special_tokens=False))

    with httpx.Client(base_url=jax_url, timeout=120.0, trust_env=False) as client:
        alone = []
        for ids in prompts:
            r = client.post("/v1/completions", json=_body(ids)).json()
            assert r["usage"]["completion_tokens"] == NEW_TOKENS
            alone.append(r["choices"][0]["text"])
        metrics = client.get("/metrics").text
    assert alone == expected

    async def together() -> list[str]:
        async with httpx.AsyncClient(base_url=jax_url, timeout=120.0, trust_env=False) as c:
            rs = await asyncio.gather(*(c.post("/v1/completions", json=_body(i)) for i in prompts))
        return [r.json()["choices"][0]["text"] for r in rs]

    assert asyncio.run(together()) == expected

    # rows that end inside a call of 8 greedy steps beside rows that go on: each stops
    # at its own max_tokens, with its own text's prefix
    lengths = [3, NEW_TOKENS, 11, NEW_TOKENS - 1]

    async def ragged() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=jax_url, timeout=120.0, trust_env=False) as c:
            rs = await asyncio.gather(
                *(
                    c.post("/v1/completions", json={**_body(i), "max_tokens": n})
                    for i, n in zip(prompts, lengths, strict=True)
                )
            )
        return [r.json() for r in rs]

    for r, n, text in zip(asyncio.run(ragged()), lengths, expected, strict=True):
        assert r["usage"]["completion_tokens"] == n
        assert text.startswith(r["choices"][0]["text"])
    found = re.search(r"^jax_engine_compiled_buckets\{[^}]*\} (\S+)$", metrics, re.M)
    assert found is not None and float(found.group(1)) == 6
