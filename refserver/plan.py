"""Request interpretation, no I/O: prompt text and token counts, faults, SSE framing, and the
stream plan (what each completion sends, and when)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from refserver.truth import (
    _FAULT_MARK,
    _KIND_BADSSE,
    _KIND_CONTENT,
    _KIND_DONE,
    _KIND_FINISH,
    _KIND_HEADERS,
    _KIND_REASONING,
    _KIND_ROLE,
    _KIND_USAGE,
    _REASONS,
    DEFAULT_MAX_TOKENS,
    FAULTS,
    TOKEN_TEXT,
    Pace,
    PlanEntry,
    RequestError,
    _Record,
)


def _text_of_content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    raise RequestError(400, "message content must be a string or a list of parts")


def chat_prompt_text(messages: Any) -> str:
    """The text the byte tokenizer counts for a chat request: contents joined by newlines."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list")
    texts = []
    for m in messages:
        if not isinstance(m, dict):
            raise RequestError(400, "each message must be an object")
        texts.append(_text_of_content(m.get("content")))
    return "\n".join(texts)


def _completion_prompt(prompt: Any) -> tuple[str, int]:
    """(text to search for faults, prompt tokens) for a completions prompt."""
    if isinstance(prompt, str):
        return prompt, len(prompt.encode("utf-8"))
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], len(prompt[0].encode("utf-8"))
    if isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        text = bytes(t for t in prompt if 0 <= t < 256).decode("utf-8", "replace")
        return text, len(prompt)
    raise RequestError(400, "'prompt' must be a string, a one-string list or a list of token ids")


def find_fault(text: str) -> str | None:
    """The fault named by the first FAULT:<name> marker in text, if any."""
    at = text.find(_FAULT_MARK)
    if at < 0:
        return None
    start = at + len(_FAULT_MARK)
    end = start
    # Names are short; scan a bounded window for the word.
    while end < len(text) and end - start < 32 and (text[end].isalnum() or text[end] == "_"):
        end += 1
    name = text[start:end]
    if name not in FAULTS:
        raise RequestError(400, f"unknown fault marker {_FAULT_MARK}{name!r}; known: {FAULTS}")
    return name


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_completion_tokens")
    if value is None:
        value = body.get("max_tokens")
    if value is None:
        return DEFAULT_MAX_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(400, f"max_tokens must be an integer >= 1, got {value!r}")
    return value


def _error_body(status: int, message: str, err_type: str) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    ).encode()


def _frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _sse(obj_json: bytes) -> bytes:
    return _frame(b"data: " + obj_json + b"\n\n")


_CHUNK_TERMINATOR = b"0\r\n\r\n"
_DONE = _frame(b"data: [DONE]\n\n") + _CHUNK_TERMINATOR


def _head(status: int, headers: list[tuple[str, str]], keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}", "server: reference-server"]
    lines += [f"{k}: {v}" for k, v in headers]
    lines.append("connection: keep-alive" if keep_alive else "connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _simple_response(
    status: int,
    body: bytes,
    keep_alive: bool,
    content_type: str = "application/json",
    extra: list[tuple[str, str]] | None = None,
) -> bytes:
    headers = [("content-type", content_type), ("content-length", str(len(body)))]
    return _head(status, headers + (extra or []), keep_alive) + body


@dataclasses.dataclass
class _Completion:
    """A parsed completion request and the bytes it will be answered with."""

    rec: _Record
    pace: Pace
    chat: bool
    include_usage: bool
    plan: list[PlanEntry]
    tail: str  # what happens after the plan: "end", "close" or "stall"
    flat: bool


def _usage_obj(prompt_tokens: int, completion_tokens: int, reasoning: int) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if reasoning:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage


def _stream_plan(
    rec: _Record, pace: Pace, chat: bool, include_usage: bool, created: int
) -> tuple[list[PlanEntry], str]:
    """Every write of a streamed response, pre-encoded; the per-request fixed parts of the
    chunk JSON are built once so the hot path only indexes a list."""
    n = rec.max_tokens
    tpc = pace.tokens_per_chunk
    model_json = json.dumps(rec.model)
    obj = "chat.completion.chunk" if chat else "text_completion"
    prefix = (
        f'{{"id":"{rec.id}","object":"{obj}","created":{created},"model":{model_json},'
    ).encode()
    fault = rec.fault

    def token_chunk(ntok: int, kind: str, finish: bool, usage: dict[str, Any] | None) -> bytes:
        piece = json.dumps(TOKEN_TEXT * ntok)
        fin = b'"length"' if finish else b"null"
        if chat:
            field = "reasoning_content" if kind == _KIND_REASONING else "content"
            choice = f'{{"index":0,"delta":{{"{field}":{piece}}},"logprobs":null,"finish_reason":'
        else:
            choice = f'{{"index":0,"text":{piece},"logprobs":null,"finish_reason":'
        tail = b"}]"
        if usage is not None:
            tail += b',"usage":' + json.dumps(usage, separators=(",", ":")).encode()
        return _sse(prefix + b'"choices":[' + choice.encode() + fin + tail + b"}")

    plan: list[PlanEntry] = []
    head = _head(
        200,
        [
            ("content-type", "text/event-stream; charset=utf-8"),
            ("cache-control", "no-cache"),
            ("transfer-encoding", "chunked"),
            ("x-request-id", rec.id),
        ],
        keep_alive=True,  # replaced below when the connection is to close
    )
    reasoning = min(pace.reasoning_tokens, n) if chat else 0
    usage = _usage_obj(rec.prompt_tokens, n, reasoning)
    last_usage = usage if pace.usage_mode == "in_last_chunk" else None

    # Token chunks: reasoning first, then content, never mixing kinds in one chunk.
    sizes: list[tuple[int, str]] = []
    for total, kind in ((reasoning, _KIND_REASONING), (n - reasoning, _KIND_CONTENT)):
        full, rest = divmod(total, tpc)
        sizes += [(tpc, kind)] * full
        if rest:
            sizes.append((rest, kind))
    # Each distinct chunk is encoded once and shared by reference.
    cache: dict[tuple[int, str], PlanEntry] = {}
    for size, kind in sizes:
        if (size, kind) not in cache:
            cache[(size, kind)] = (token_chunk(size, kind, False, None), size, kind)
    token_entries = [cache[s] for s in sizes]
    if pace.finish_on_last_token and token_entries:
        size, kind = sizes[-1]
        token_entries[-1] = (token_chunk(size, kind, True, last_usage), size, kind)

    if chat and pace.role_chunk:
        role = prefix + (
            b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}]}'
        )
        plan.append((head + _sse(role), 0, _KIND_ROLE))
    else:
        # The headers go out at once, before the first token, as engines do; recorded as
        # t_headers_ns rather than as a chunk.
        plan.append((head, 0, _KIND_HEADERS))

    tail_action = "end"
    cut = len(token_entries)
    if fault in ("disconnect", "stall"):
        cut = min(pace.fault_after, len(token_entries))
        tail_action = "close" if fault == "disconnect" else "stall"
    plan += token_entries[:cut]
    if fault == "badsse":
        # Truncated JSON on an otherwise well-framed event, after fault_after token chunks.
        bad = b'data: {"id":"' + rec.id.encode() + b'","choices":[{"delta":{"content":"tok\n\n'
        at = 1 + min(pace.fault_after, len(token_entries))
        plan.insert(at, (_frame(bad), 0, _KIND_BADSSE))
    if tail_action != "end":
        return plan, tail_action

    if not pace.finish_on_last_token:
        if chat:
            fin = b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]'
        else:
            fin = b'"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]'
        if last_usage is not None:
            fin += b',"usage":' + json.dumps(last_usage, separators=(",", ":")).encode()
        plan.append((_sse(prefix + fin + b"}"), 0, _KIND_FINISH))
    if pace.usage_mode == "separate" and include_usage:
        u = json.dumps(usage, separators=(",", ":")).encode()
        plan.append((_sse(prefix + b'"choices":[],"usage":' + u + b"}"), 0, _KIND_USAGE))
    plan.append((_DONE, 0, _KIND_DONE))
    return plan, tail_action


def _full_body(rec: _Record, pace: Pace, chat: bool, created: int) -> bytes:
    n = rec.max_tokens
    reasoning = min(pace.reasoning_tokens, n) if chat else 0
    usage = _usage_obj(rec.prompt_tokens, n, reasoning)
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": TOKEN_TEXT * (n - reasoning)}
        if reasoning:
            message["reasoning_content"] = TOKEN_TEXT * reasoning
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": TOKEN_TEXT * n, "logprobs": None}
        obj = "text_completion"
    choice["finish_reason"] = "length"
    body = {
        "id": rec.id,
        "object": obj,
        "created": created,
        "model": rec.model,
        "choices": [choice],
        "usage": usage,
    }
    return json.dumps(body, separators=(",", ":")).encode()
