"""The load generator against a real engine: llama.cpp's server on the tiny generated model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from agent.jobfolder import JobFolder
from agent.loadgen.client import OpenAIClient
from agent.loadgen.probe import run_probe
from agent.loadgen.prompts import PromptFactory, calibrate
from agent.loadgen.sweep import run_sweep
from contract.results import RequestRecord
from contract.suite import ProbeSettings, RequestSettings, Shape, SweepSettings
from engines.recipes import get_recipe

pytestmark = pytest.mark.slow

REQUEST = RequestSettings(extra_body=dict(get_recipe("llamacpp").request_extras))


def test_probe_on_llamacpp_forces_length_and_repeats_greedy_text(
    llama_server_url: str, tmp_path: Path
):
    settings = ProbeSettings(output_tokens=32, repeats=2, at_once=4, request=REQUEST)

    async def go(folder: Path):
        async with OpenAIClient(llama_server_url, settings=REQUEST, max_connections=4) as c:
            return await run_probe(c, settings, JobFolder(folder))

    summary = asyncio.run(go(tmp_path))
    assert summary.requests_failed == 0, summary.errors
    assert summary.repeat_identical == 6
    # A second run writes the same greedy text: the same digest.
    again = asyncio.run(go(tmp_path / "again"))
    assert summary.texts_sha256 and again.texts_sha256 == summary.texts_sha256
    assert summary.e2e_tok_s and summary.ttft_ms and summary.at_once_aggregate_tok_s
    records = [
        RequestRecord.model_validate_json(line)
        for line in (tmp_path / "requests.jsonl").read_text().splitlines()
    ]
    assert all(r.completion_tokens == 32 for r in records)
    assert all(r.usage_chunk_mismatch == 0 for r in records)


def test_sweep_on_llamacpp_has_exact_input_lengths(llama_server_url: str, tmp_path: Path):
    settings = SweepSettings(
        shapes=(Shape(input_tokens=200, output_tokens=16),),
        levels=(1, 4),
        repeats=1,
        request=REQUEST,
    )

    async def go():
        async with OpenAIClient(llama_server_url, settings=REQUEST, max_connections=4) as c:
            return await run_sweep(c, settings, JobFolder(tmp_path))

    summary = asyncio.run(go())
    assert summary.counts == {"measured": 2, "partial": 0, "failed": 0, "infeasible": 0}
    assert summary.calibration and summary.calibration.tokenize_endpoint == "/tokenize"
    for line in (tmp_path / "requests.jsonl").read_text().splitlines():
        r = RequestRecord.model_validate_json(line)
        assert r.ok, r.error
        assert r.prompt_tokens == 200, "exact input length, chat template included"
        assert r.completion_tokens == 16


def test_no_two_prompts_share_their_first_64_tokens_in_the_engines_own_tokenizer(
    llama_server_url: str,
):
    async def go() -> list[list[int]]:
        async with OpenAIClient(llama_server_url, settings=REQUEST) as client:
            await client.server_info()
            calibration = await calibrate(client)
            factory = PromptFactory(calibration, client.tokenize_raw)
            prompts = await factory.build(300, 512)
        async with httpx.AsyncClient(base_url=llama_server_url) as http:
            tokenized = []
            for p in prompts:
                response = await http.post("/tokenize", json={"content": p.text})
                tokenized.append(response.json()["tokens"])
        return tokenized

    tokens = asyncio.run(go())
    heads = {tuple(t[:64]) for t in tokens}
    assert len(heads) == len(tokens)
