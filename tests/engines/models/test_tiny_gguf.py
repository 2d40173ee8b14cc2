"""The tiny random-weight GGUF: deterministic bytes, the keys and tensors llama.cpp reads,
and (served by a real llama-server) exact byte-level token counts and clean ASCII output."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import httpx
import orjson
import pytest

from engines.models import tiny_gguf
from engines.models.tiny_gguf import (
    CHAT_TEMPLATE,
    VOCAB_SIZE,
    expected_token_count,
    write_tiny_gguf,
)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = write_tiny_gguf(tmp_path / "a.gguf", seed=7)
    b = write_tiny_gguf(tmp_path / "b.gguf", seed=7)
    c = write_tiny_gguf(tmp_path / "c.gguf", seed=8)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)
    assert not list(tmp_path.glob(".*.tmp"))


def _field(reader: gguf.GGUFReader, key: str) -> object:
    field = reader.get_field(key)
    assert field is not None, key
    return field.contents()


def test_reader_sees_llama_keys_vocab_and_tensors(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", n_ctx_train=2048)
    r = gguf.GGUFReader(path)
    assert _field(r, "general.architecture") == "llama"
    assert _field(r, "llama.context_length") == 2048
    assert _field(r, "llama.embedding_length") == 64
    assert _field(r, "llama.block_count") == 2
    assert _field(r, "llama.attention.head_count") == 4
    assert _field(r, "llama.feed_forward_length") == 128
    assert _field(r, "tokenizer.ggml.model") == "llama"
    assert _field(r, "tokenizer.ggml.add_space_prefix") is False
    assert _field(r, "tokenizer.ggml.add_bos_token") is False
    assert _field(r, "tokenizer.chat_template") == CHAT_TEMPLATE
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list) and len(tokens) == VOCAB_SIZE
    assert tokens[_field(r, "tokenizer.ggml.bos_token_id")] == "<s>"
    assert tokens[_field(r, "tokenizer.ggml.eos_token_id")] == "</s>"
    assert [tokens[tiny_gguf.BYTE0_ID + b] for b in (0, 0x41, 0xFF)] == [
        "<0x00>",
        "<0x41>",
        "<0xFF>",
    ]

    tensors = {t.name: t for t in r.tensors}
    expected = {"token_embd.weight", "output_norm.weight", "output.weight"}
    for i in range(2):
        expected |= {
            f"blk.{i}.{n}.weight"
            for n in (
                "attn_norm",
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_norm",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
            )
        }
    assert set(tensors) == expected
    # GGUF lists dimensions innermost first: (n_embd, n_vocab) for the embedding.
    assert list(tensors["token_embd.weight"].shape) == [64, VOCAB_SIZE]
    assert list(tensors["blk.0.ffn_down.weight"].shape) == [128, 64]
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in r.tensors)


def test_expected_token_count_is_utf8_bytes() -> None:
    assert expected_token_count("hello world") == 11
    assert expected_token_count("é€") == 5


@pytest.mark.slow
@pytest.mark.parametrize(
    "text",
    ["hello world", "Record 000042. The quick brown fox\njumps.", "  two  spaces", "é€ 日本"],
)
def test_served_token_count_is_byte_count(llama_server_url: str, text: str) -> None:
    resp = httpx.post(f"{llama_server_url}/tokenize", json={"content": text}, timeout=10)
    resp.raise_for_status()
    assert len(resp.json()["tokens"]) == expected_token_count(text)


@pytest.mark.slow
def test_completion_prompt_tokens_and_forced_length(llama_server_url: str) -> None:
    prompt = "Record 7. " + "word " * 100
    resp = httpx.post(
        f"{llama_server_url}/v1/completions",
        json={"prompt": prompt, "max_tokens": 64, "temperature": 0, "ignore_eos": True},
        timeout=60,
    )
    resp.raise_for_status()
    body = resp.json()
    assert body["usage"]["prompt_tokens"] == expected_token_count(prompt)
    assert body["usage"]["completion_tokens"] == 64
    text = body["choices"][0]["text"]
    assert len(text) == 64 and text.isascii() and text.isprintable()


@pytest.mark.slow
def test_streamed_chat_one_printable_chunk_per_token(llama_server_url: str) -> None:
    chunks: list[str] = []
    usage: dict[str, int] | None = None
    body = {
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 200,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    with httpx.stream(
        "POST", f"{llama_server_url}/v1/chat/completions", json=body, timeout=60
    ) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                delta = choice.get("delta", {})
                assert not delta.get("reasoning_content")
                if delta.get("content"):
                    chunks.append(delta["content"])
    assert usage is not None
    # Without EOS the reply always runs to max_tokens, one character per token and chunk.
    assert usage["completion_tokens"] == 200
    assert len(chunks) == 200
    assert all(len(c) == 1 and c.isascii() and c.isprintable() for c in chunks)
    # Thinking off closes an empty think block: a longer prompt than thinking on.
    on = httpx.post(
        f"{llama_server_url}/v1/chat/completions",
        json={
            **body,
            "stream": False,
            "max_tokens": 1,
            "chat_template_kwargs": {"enable_thinking": True},
        },
        timeout=60,
    ).json()["usage"]["prompt_tokens"]
    assert usage["prompt_tokens"] == on + expected_token_count("<think>\n\n</think>\n\n")
