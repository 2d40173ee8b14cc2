"""Incremental server-sent-events parsing of an OpenAI streaming response into raw times.

`StreamRecorder.feed` is called with each body fragment as it arrives and the time it
arrived (stamped by the transport before any parsing). It splits events, decodes each
`data:` payload once with orjson, and keeps only what the metrics need: when content and
reasoning events arrived, how much text each carried, usage, finish reason and errors.
"""

from __future__ import annotations

import hashlib

import orjson

__all__ = ["StreamRecorder"]

_DONE = b"[DONE]"
_MAX_ERROR_BODY = 300


class StreamRecorder:
    """Collects one response. Transport calls: `start`, `feed` (many), then reads fields."""

    __slots__ = (
        "_buffer",
        "_cumulative_tokens",
        "_keep_text",
        "_streaming",
        "_text_parts",
        "chunk_chars",
        "chunk_ns",
        "content_chars",
        "content_chunks",
        "content_type",
        "done",
        "end_ns",
        "error",
        "finish_reason",
        "first_chunk_ns",
        "first_content_ns",
        "first_token_ns",
        "http_status",
        "last_token_ns",
        "reasoning_chars",
        "reasoning_chunks",
        "timings",
        "usage",
    )

    def __init__(self, *, keep_text: bool = True) -> None:
        self._buffer = b""
        self._keep_text = keep_text
        self._streaming = True
        self._text_parts: list[str] = []
        self._cumulative_tokens: list[int | None] = []
        self.chunk_ns: list[int] = []
        self.chunk_chars: list[int] = []
        self.content_chars = 0
        self.content_chunks = 0
        self.reasoning_chars = 0
        self.reasoning_chunks = 0
        self.content_type = ""
        self.done = False
        self.end_ns: int | None = None
        self.error: str | None = None
        self.finish_reason: str | None = None
        self.first_chunk_ns: int | None = None
        self.first_content_ns: int | None = None
        self.first_token_ns: int | None = None
        self.http_status: int | None = None
        self.last_token_ns: int | None = None
        self.usage: dict[str, object] | None = None
        self.timings: dict[str, object] | None = None

    def start(self, status: int, content_type: str) -> None:
        """Headers arrived: decide whether the body is an event stream."""
        self.http_status = status
        self.content_type = content_type
        self._streaming = status < 400 and content_type.startswith("text/event-stream")

    def feed(self, t_ns: int, data: bytes) -> None:
        if not self._streaming:
            self._buffer += data
            return
        buffer = self._buffer + data if self._buffer else data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        start = 0
        while (end := buffer.find(b"\n\n", start)) >= 0:
            self._event(t_ns, buffer[start:end])
            start = end + 2
        self._buffer = buffer[start:]

    def close(self, t_ns: int) -> None:
        """Body complete (or connection gone): settle errors and the end time."""
        if self.end_ns is None:
            self.end_ns = t_ns
        if not self._streaming:
            self._settle_unstreamed_body()
            return
        if self._buffer.strip():
            # A last event without its blank line still counts (some servers omit it).
            self._event(t_ns, self._buffer.strip(b"\n"))
            self._buffer = b""

    @property
    def text(self) -> str:
        return "".join(self._text_parts)

    def text_sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def cumulative_tokens(self) -> list[int | None]:
        """usage.completion_tokens seen on each token event (continuous usage stats)."""
        return self._cumulative_tokens

    def _settle_unstreamed_body(self) -> None:
        body = self._buffer
        self._buffer = b""
        message = _error_message(body)
        if self.http_status is not None and self.http_status >= 400:
            self.error = f"HTTP {self.http_status}: {message}"
        elif self.error is None:
            self.error = (
                f"server did not stream (Content-Type: {self.content_type or 'none'}): {message}"
            )

    def _event(self, t_ns: int, raw: bytes) -> None:
        if self.first_chunk_ns is None:
            self.first_chunk_ns = t_ns
        payload: bytes | None
        if raw.startswith(b"data: ") and b"\n" not in raw:
            payload = raw[6:]
        else:
            payload = self._data_of(raw)
            if payload is None:
                return
        if payload == _DONE:
            self.done = True
            self.end_ns = t_ns
            return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self._fail(f"malformed SSE event: {payload[:80]!r}")
            return
        if not isinstance(event, dict):
            self._fail(f"malformed SSE event (not an object): {payload[:80]!r}")
            return
        if "error" in event:
            self._fail(f"error event: {_error_message(payload)}")
            return
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        # llama.cpp's own per-response counts (draft_n, draft_n_accepted), on its last event.
        timings = event.get("timings")
        if isinstance(timings, dict):
            self.timings = timings
        choices = event.get("choices")
        if not choices:
            return
        choice = choices[0]
        delta = choice.get("delta")
        if delta is None:
            content, reasoning = choice.get("text"), None
        else:
            content = delta.get("content")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            tool_calls = delta.get("tool_calls")
            if tool_calls and not content:
                content = "".join(
                    str((call.get("function") or {}).get("arguments") or "")
                    + str((call.get("function") or {}).get("name") or "")
                    for call in tool_calls
                )
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if not content and not reasoning:
            return
        if self.first_token_ns is None:
            self.first_token_ns = t_ns
        if content:
            if self.first_content_ns is None:
                self.first_content_ns = t_ns
            self.content_chunks += 1
            self.content_chars += len(content)
            if self._keep_text:
                self._text_parts.append(content)
        if reasoning:
            self.reasoning_chunks += 1
            self.reasoning_chars += len(reasoning)
        self.last_token_ns = t_ns
        self.chunk_ns.append(t_ns)
        self.chunk_chars.append(len(content or "") + len(reasoning or ""))
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        self._cumulative_tokens.append(tokens if isinstance(tokens, int) else None)

    def _data_of(self, raw: bytes) -> bytes | None:
        lines: list[bytes] = []
        for line in raw.split(b"\n"):
            if line.startswith(b"data:"):
                lines.append(line[6:] if line.startswith(b"data: ") else line[5:])
            elif line.startswith(b"event:") and line[6:].strip() == b"error":
                self._fail("error event")
        return b"\n".join(lines) if lines else None

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message


def _error_message(body: bytes) -> str:
    """The human part of an error body: OpenAI's error.message, else the body's start."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:_MAX_ERROR_BODY].decode(errors="replace").strip() or "(empty body)"
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:_MAX_ERROR_BODY]
        if isinstance(error, str):
            return error[:_MAX_ERROR_BODY]
        if isinstance(parsed.get("detail"), str):
            return parsed["detail"][:_MAX_ERROR_BODY]
    return body[:_MAX_ERROR_BODY].decode(errors="replace")
