"""Real-text sweep prompts: exact lengths, unique heads, and text that is the source's own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agent.evals.task import DataError
from agent.jobfolder import JobFolder
from agent.loadgen.client import ChatRequest, OpenAIClient
from agent.loadgen.prompts import Prompt, PromptFactory, calibrate
from agent.loadgen.sweep import run_sweep
from agent.loadgen.text_sources import TextSource, calibrate_source, load_source
from contract.results import RequestRecord
from contract.suite import RequestSettings, Shape, SweepSettings
from engines.recipes import get_recipe
from refserver.harness import reference_server

MINI = Path(__file__).parents[1] / "evals" / "data" / "gsm8k_mini.jsonl"
HEAD_TOKENS = 64


def _drawn_from(source: TextSource, text: str, nonce: str) -> bool:
    """The words after the nonce are a run of the source's words (wrapping round).

    Exact length may end a prompt with a few of the factory's one-token pads (" x", " .",
    "."), so trailing pad words are dropped and the last word is compared without dots.
    """
    words = text.removeprefix(nonce).split()
    while words and words[-1] in ("x", ".", "x."):
        words.pop()
    doubled = source.words + source.words
    n = len(words)
    for i in range(len(source.words)):
        run = doubled[i : i + n]
        if list(run[:-1]) == words[:-1] and run[-1].rstrip(".") == words[-1].rstrip("."):
            return True
    return False


def test_sweep_with_jsonl_text_has_exact_lengths_unique_heads_and_source_text(tmp_path: Path):
    source = load_source(f"jsonl:{MINI}")
    assert source is not None
    settings = SweepSettings(
        shapes=(Shape(input_tokens=300, output_tokens=4),),
        levels=(4,),
        repeats=2,
        prompts=f"jsonl:{MINI}",
    )

    async def go():
        async with OpenAIClient(server.url, settings=settings.request) as client:
            return await run_sweep(client, settings, JobFolder(tmp_path))

    with reference_server(ttft_ms=1, itl_ms=1) as server:
        summary = asyncio.run(go())
        truth = server.ground_truth()
    assert summary.counts["measured"] == 1
    assert summary.calibration is not None
    assert summary.calibration.text_source == f"jsonl:{MINI}"
    assert summary.calibration.text_sha256 == source.sha256
    records = [
        RequestRecord.model_validate_json(line)
        for line in (tmp_path / "requests.jsonl").read_text().splitlines()
    ]
    assert records and all(r.prompt_tokens == r.input_tokens_target == 300 for r in records)
    # The reference server's tokenizer is one token per byte: the first 64 bytes are the
    # first 64 tokens, and the server kept each prompt's first 96 characters.
    heads = [t.prompt_head for t in truth if t.request_id in {r.request_id for r in records}]
    assert len(heads) == len(records)
    assert len({h.encode()[:HEAD_TOKENS] for h in heads}) == len(heads)


def _factory_prompts(url: str, n: int, target: int, source: TextSource) -> list[Prompt]:
    async def go() -> list[Prompt]:
        async with OpenAIClient(url, settings=REQUEST) as client:
            await client.server_info()
            calibration = await calibrate_source(client, await calibrate(client), source)
            assert calibration.tokenize_endpoint
            factory = PromptFactory(calibration, client.tokenize_raw, source=source)
            return await factory.build(n, target)

    return asyncio.run(go())


REQUEST = RequestSettings(extra_body=dict(get_recipe("llamacpp").request_extras))


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["bfcl", f"jsonl:{MINI}"])
def test_real_text_prompts_are_exact_on_llamacpps_tokenizer(llama_server_url: str, spec: str):
    source = load_source(spec)
    assert source is not None
    target = 160
    prompts = _factory_prompts(llama_server_url, 12, target, source)
    ids: list[list[int]] = []
    with httpx.Client(base_url=llama_server_url, timeout=30) as http:
        for p in prompts:
            assert _drawn_from(source, p.text, p.nonce), p.text[:120]
            response = http.post("/tokenize", json={"content": p.text, "add_special": False})
            ids.append(response.json()["tokens"])

    async def send() -> list[RequestRecord]:
        async with OpenAIClient(llama_server_url, settings=REQUEST) as client:
            await client.server_info()
            return [
                await client.send(
                    ChatRequest(prompt=p.text, max_tokens=2, label="t", request_id=str(i))
                )
                for i, p in enumerate(prompts)
            ]

    assert all(p.raw_tokens == len(i) for p, i in zip(prompts, ids, strict=True))
    assert len({p.raw_tokens for p in prompts}) == 1, [(p.raw_tokens, p.text) for p in prompts]
    sent = asyncio.run(send())
    wrong = [(r.prompt_tokens, p.text) for r, p in zip(sent, prompts, strict=True)]
    assert {r.prompt_tokens for r in sent} == {target}, [w for w in wrong if w[0] != target]
    assert len({tuple(i[:HEAD_TOKENS]) for i in ids}) == len(ids)


def test_sources_and_their_errors(tmp_path: Path):
    assert load_source("synthetic") is None
    with pytest.raises(DataError, match="sha256"):
        load_source("gsm8k", gsm8k_data=MINI)  # the pinned loader refuses another file
    with pytest.raises(DataError, match="does not exist"):
        load_source(f"jsonl:{tmp_path / 'none.jsonl'}")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "no text"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: expected a string or an object"):
        load_source(f"jsonl:{bad}")
    bfcl = load_source("bfcl")
    assert bfcl is not None and "triangle" in bfcl.words
    a, b = bfcl.words_for("n1", 50), bfcl.words_for("n2", 50)
    assert a != b and a == bfcl.words_for("n1", 50)


def test_bench_sweep_rejects_an_unknown_prompt_source_in_one_line(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "sweep", "http://127.0.0.1:9", "--prompts", "poems"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        cwd=tmp_path,
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("bench sweep: prompts:")
