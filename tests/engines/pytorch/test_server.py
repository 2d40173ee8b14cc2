"""The engine over HTTP, as clients see it: a real server subprocess on random:tiny (CPU).

Covers answers streamed and not, usage against streamed tokens, greedy text identical
across repeats and between batch 1 and a batch of 8, stop / max_tokens / ignore_eos /
min_tokens, 64 concurrent streams, clear 4xx errors while other requests go on, and the
tokenize, models and metrics routes.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from typing import Any

import httpx
import orjson
import pytest

pytestmark = pytest.mark.slow

MODEL = "random:tiny"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "1, 2, 3, 4,",
    "Translate to German: good morning",
    "SELECT * FROM",
    "The mitochondria is",
    "Q: What is 2+2?\nA:",
]


def _chat(content: str, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}


def _stream_events(resp: httpx.Response) -> list[Any]:
    events: list[Any] = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events


def _stream(client: httpx.Client, path: str, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        return _stream_events(resp)


def _content_chunks(events: list[Any], kind: str) -> list[dict[str, Any]]:
    """Chunks that carry a token (not the role opener, not the usage-only chunk)."""
    out = []
    for e in events:
        if e == "[DONE]" or not e["choices"]:
            continue
        choice = e["choices"][0]
        if kind == "chat" and "role" in choice["delta"]:
            continue
        out.append(choice)
    return out


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^pytorch_engine_{name}\{{[^}}]*{labels}[^}}]*\}} (\S+)$"
    values = [float(m.group(1)) for m in re.finditer(pattern, text, re.M)]
    assert values, f"{name} {labels} not in /metrics"
    return sum(values)


def test_health_models_version(client: httpx.Client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == MODEL
    assert models["data"][0]["max_model_len"] == 4096
    assert client.get("/version").json()["batch_invariant"] is True
    assert client.get("/version").json()["quantization"] is None


def test_chat_non_streaming_and_streaming_agree(client: httpx.Client) -> None:
    body = _chat("Hello!", max_tokens=16, temperature=0, ignore_eos=True)
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    full = resp.json()
    assert full["object"] == "chat.completion"
    choice = full["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    assert full["usage"]["completion_tokens"] == 16
    assert full["usage"]["total_tokens"] == full["usage"]["prompt_tokens"] + 16

    events = _stream(
        client, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}}
    )
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    chunks = _content_chunks(events, "chat")
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == full["usage"]
    # one chunk per generated token: the count a client makes equals usage
    assert len(chunks) == usage_chunk["usage"]["completion_tokens"] == 16
    assert chunks[-1]["finish_reason"] == "length"
    assert all(c["finish_reason"] is None for c in chunks[:-1])
    assert "".join(c["delta"]["content"] for c in chunks) == choice["message"]["content"]
    # random models generate one visible character a token, so no chunk is empty
    assert all(len(c["delta"]["content"]) == 1 for c in chunks)


def test_completions_streaming_and_not(client: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "prompt": "Hello",
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
    }
    full = client.post("/v1/completions", json=body).json()
    assert full["object"] == "text_completion"
    events = _stream(client, "/v1/completions", body)  # no include_usage: usage on the final chunk
    chunks = _content_chunks(events, "text")
    assert len(chunks) == full["usage"]["completion_tokens"] == 12
    assert "".join(c["text"] for c in chunks) == full["choices"][0]["text"]
    assert events[-2]["usage"] == full["usage"]
    prompt_ids = client.post("/tokenize", json={"model": MODEL, "prompt": "Hello"}).json()
    assert prompt_ids["count"] == full["usage"]["prompt_tokens"] == 6
    by_ids = client.post("/v1/completions", json={**body, "prompt": prompt_ids["tokens"]}).json()
    assert by_ids["choices"][0]["text"] == full["choices"][0]["text"]


async def _concurrent_chat(url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=len(bodies) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits, trust_env=False) as c:
        resps = await asyncio.gather(*(c.post("/v1/chat/completions", json=b) for b in bodies))
    for r in resps:
        assert r.status_code == 200, r.text
    return [r.json() for r in resps]


def test_greedy_identical_across_repeats_and_batch_sizes(
    client: httpx.Client, pytorch_engine_url: str
) -> None:
    bodies = [_chat(p, max_tokens=40, temperature=0, ignore_eos=True) for p in PROMPTS]

    def texts(responses: list[dict[str, Any]]) -> list[str]:
        return [r["choices"][0]["message"]["content"] for r in responses]

    alone = texts([client.post("/v1/chat/completions", json=b).json() for b in bodies])
    again = texts([client.post("/v1/chat/completions", json=b).json() for b in bodies])
    assert alone == again
    assert len(set(alone)) == len(alone), "different prompts should give different text"

    before = client.get("/metrics").text
    together = texts(asyncio.run(_concurrent_chat(pytorch_engine_url, bodies)))
    after = client.get("/metrics").text
    assert together == alone

    # the 8 really shared decode steps: some steps ran more than 4 rows
    def multi(t: str) -> float:
        return _metric(t, "decode_batch_size_count") - _metric(
            t, "decode_batch_size_bucket", 'le="4.0"'
        )

    assert multi(after) > multi(before)


def test_stop_strings_cut_the_text(client: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
    }
    text = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    printable = [i for i in range(8, len(text) - 2) if text[i : i + 2].isprintable()]
    assert printable, f"no printable pair to stop on in {text!r}"
    stop = text[printable[0] : printable[0] + 2]
    expected = text[: text.find(stop)]

    full = client.post("/v1/completions", json={**body, "stop": [stop, "\x00never"]}).json()
    assert full["choices"][0]["text"] == expected
    assert full["choices"][0]["finish_reason"] == "stop"
    assert full["choices"][0]["stop_reason"] == stop

    chunks = _content_chunks(_stream(client, "/v1/completions", {**body, "stop": stop}), "text")
    assert "".join(c["text"] for c in chunks) == expected
    assert chunks[-1]["finish_reason"] == "stop"

    # a stop token id ends the text at its first occurrence; a visible token's text stays
    char = text[5]
    by_id = client.post("/v1/completions", json={**body, "stop_token_ids": [ord(char)]}).json()
    assert by_id["choices"][0]["text"] == text[: text.find(char) + 1]
    assert by_id["choices"][0]["stop_reason"] == ord(char)


def test_max_tokens_eos_ignore_eos_min_tokens(client: httpx.Client) -> None:
    base = {"model": MODEL, "prompt": "Tell me a story.", "temperature": 1.0, "max_tokens": 300}
    stopped = None
    for seed in range(40):  # sampled text meets EOS in ~90% of 300-token runs; bounded search
        r = client.post("/v1/completions", json={**base, "seed": seed}).json()
        if r["choices"][0]["finish_reason"] == "stop":
            stopped = (seed, r)
            break
    assert stopped is not None, "no seed met EOS"
    seed, first = stopped
    n_eos = first["usage"]["completion_tokens"]
    assert n_eos < 300
    # seeded sampling repeats
    assert (
        client.post("/v1/completions", json={**base, "seed": seed}).json()["choices"]
        == first["choices"]
    )
    ignored = client.post("/v1/completions", json={**base, "seed": seed, "ignore_eos": True}).json()
    assert ignored["choices"][0]["finish_reason"] == "length"
    assert ignored["usage"]["completion_tokens"] == 300
    at_least = client.post(
        "/v1/completions", json={**base, "seed": seed, "min_tokens": n_eos + 5}
    ).json()
    assert at_least["usage"]["completion_tokens"] >= n_eos + 5
    short = client.post("/v1/completions", json={**base, "seed": seed, "max_tokens": 7}).json()
    assert short["usage"]["completion_tokens"] == 7
    assert short["choices"][0]["finish_reason"] == "length"


async def _stream_many(
    url: str, n: int, max_tokens: int, model: str = MODEL
) -> list[tuple[int, dict[str, Any], bool]]:
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits, trust_env=False) as c:

        async def one(i: int) -> tuple[int, dict[str, Any], bool]:
            body = _chat(
                f"{i} stream me",
                max_tokens=max_tokens,
                temperature=0.8 if i % 2 else 0.0,
                seed=i,
                ignore_eos=True,
                stream=True,
                stream_options={"include_usage": True},
            )
            body["model"] = model
            tokens, usage, done = 0, {}, False
            async with c.stream("POST", "/v1/chat/completions", json=body) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    payload = line.removeprefix("data: ")
                    if payload == "[DONE]":
                        done = True
                        continue
                    event = orjson.loads(payload)
                    if event["choices"] and "role" not in event["choices"][0]["delta"]:
                        tokens += 1
                    if not event["choices"]:
                        usage = event["usage"]
            return tokens, usage, done

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_64_concurrent_streams_complete(pytorch_engine_url: str) -> None:
    t0 = time.monotonic()
    results = asyncio.run(_stream_many(pytorch_engine_url, 64, 24))
    assert len(results) == 64
    for tokens, usage, done in results:
        assert done
        assert tokens == usage["completion_tokens"] == 24
    assert time.monotonic() - t0 < 60


def test_bad_requests_get_clear_4xx_while_others_run(
    client: httpx.Client, pytorch_engine_url: str
) -> None:
    background: dict[str, Any] = {}

    def long_request() -> None:
        with httpx.Client(base_url=pytorch_engine_url, timeout=60.0, trust_env=False) as c:
            background["resp"] = c.post(
                "/v1/chat/completions",
                json=_chat("keep going", max_tokens=200, temperature=0, ignore_eos=True),
            )

    worker = threading.Thread(target=long_request)
    worker.start()
    try:
        cases: list[tuple[str, Any, int, str]] = [
            (
                "/v1/chat/completions",
                b'{"model": "random:tiny", "messages": [',
                400,
                "not valid JSON",
            ),
            ("/v1/chat/completions", _chat("hi", model="no-such-model"), 404, "does not exist"),
            (
                "/v1/completions",
                {"model": MODEL, "prompt": "x" * 5000},
                400,
                "maximum context length is 4096",
            ),
            (
                "/v1/completions",
                {"model": MODEL, "prompt": "hi", "max_tokens": 4095},
                400,
                "maximum context length",
            ),
            ("/v1/chat/completions", _chat("hi", max_tokens=-3), 400, "max_tokens"),
            (
                "/v1/completions",
                {"model": MODEL, "prompt": "hi", "max_tokens": 0},
                400,
                "max_tokens",
            ),
            ("/v1/chat/completions", {"model": MODEL}, 400, "messages: field required"),
            ("/v1/chat/completions", _chat("hi", n=2), 400, "n=1"),
            (
                "/v1/completions",
                {"model": MODEL, "prompt": "hi", "temperature": -1},
                400,
                "temperature",
            ),
            ("/v1/completions", [1, 2], 400, "JSON object"),
        ]
        for path, body, status, fragment in cases:
            if isinstance(body, bytes):
                resp = client.post(path, content=body, headers={"content-type": "application/json"})
            else:
                resp = client.post(path, json=body)
            assert resp.status_code == status, (body, resp.text)
            error = resp.json()["error"]
            assert fragment in error["message"], error
            assert error["code"] == status
            assert "\n" not in error["message"]
    finally:
        worker.join(60)
    assert background["resp"].status_code == 200
    assert background["resp"].json()["usage"]["completion_tokens"] == 200
    assert (
        client.post("/v1/chat/completions", json=_chat("still there?", max_tokens=3)).status_code
        == 200
    )


def test_tokenize_forms_and_thinking_switch(client: httpx.Client) -> None:
    plain = client.post("/tokenize", json={"model": MODEL, "prompt": "hé"}).json()
    assert plain == {
        "count": 4,
        "max_model_len": 4096,
        "tokens": [257, 104, 195, 169],
        "token_strs": None,
    }
    msgs = [{"role": "user", "content": "hi"}]
    on = client.post("/tokenize", json={"messages": msgs}).json()
    off = client.post(
        "/tokenize", json={"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}}
    ).json()
    assert off["count"] == on["count"] + 6  # "<think>\n\n</think>\n\n"
    chat = client.post(
        "/v1/chat/completions",
        json={**_chat("hi", max_tokens=1), "chat_template_kwargs": {"enable_thinking": False}},
    ).json()
    assert chat["usage"]["prompt_tokens"] == off["count"]
    assert (
        client.post("/detokenize", json={"tokens": plain["tokens"]}).json()["prompt"] == "<|bos|>hé"
    )


def test_disconnect_frees_the_slot_and_metrics_report(client: httpx.Client) -> None:
    body = _chat("go on forever", max_tokens=3000, temperature=0, ignore_eos=True, stream=True)
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        for i, _line in enumerate(resp.iter_lines()):
            if i > 6:
                break
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = client.get("/metrics").text
        if _metric(text, "requests_running") == 0:
            break
        time.sleep(0.2)
    assert _metric(text, "requests_running") == 0
    assert _metric(text, "requests_waiting") == 0
    assert _metric(text, "generation_tokens_total") > 0
    assert _metric(text, "requests_finished_total", 'finished_reason="abort"') >= 1
    assert _metric(text, "step_seconds_count", 'phase="decode"') > 0


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
                results = asyncio.run(_stream_many(url, 16, 24, model="random:tiny-gemma4"))
                for tokens, usage, done in results:
                    assert done and tokens == usage["completion_tokens"] == 24
    assert answers[0] == answers[1]
