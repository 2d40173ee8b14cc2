"""The SSE recorder: events split across reads, usage wherever it rides, errors as data."""

from __future__ import annotations

import orjson

from agent.loadgen.sse import StreamRecorder


def chat_chunk(
    content: str | None = None,
    *,
    reasoning: str | None = None,
    finish: str | None = None,
    usage: dict | None = None,
    role: bool = False,
) -> bytes:
    delta: dict = {}
    if role:
        delta["role"] = "assistant"
        delta["content"] = ""
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    event: dict = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        event["usage"] = usage
    return b"data: " + orjson.dumps(event) + b"\n\n"


def usage_chunk(prompt: int, completion: int) -> bytes:
    event = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    return b"data: " + orjson.dumps(event) + b"\n\n"


def started() -> StreamRecorder:
    rec = StreamRecorder()
    rec.start(200, "text/event-stream; charset=utf-8")
    return rec


def test_every_event_gets_the_time_its_bytes_arrived_even_when_split():
    stream = chat_chunk(role=True) + chat_chunk("Hel") + chat_chunk("lo") + b"data: [DONE]\n\n"
    rec = started()
    # Split inside the second event: its time is that of the read that completed it.
    cut = len(chat_chunk(role=True)) + 7
    rec.feed(100, stream[:cut])
    rec.feed(200, stream[cut:])
    rec.close(300)
    assert rec.first_chunk_ns == 100  # the role chunk
    assert rec.first_token_ns == 200
    assert rec.chunk_ns == [200, 200]
    assert rec.text == "Hello"
    assert rec.done and rec.end_ns == 200


def test_usage_in_its_own_chunk_and_on_a_chunk_with_choices():
    rec = started()
    rec.feed(1, chat_chunk("a") + usage_chunk(10, 1) + b"data: [DONE]\n\n")
    assert rec.usage == {"prompt_tokens": 10, "completion_tokens": 1}
    old_llamacpp = started()
    old_llamacpp.feed(
        1,
        chat_chunk("a")
        + chat_chunk("", finish="length", usage={"prompt_tokens": 3, "completion_tokens": 1}),
    )
    assert old_llamacpp.usage == {"prompt_tokens": 3, "completion_tokens": 1}
    assert old_llamacpp.finish_reason == "length"
    assert old_llamacpp.chunk_ns == [1]  # the empty finishing delta is not a token


def test_reasoning_is_counted_apart_from_content_and_starts_ttft():
    rec = started()
    rec.feed(5, chat_chunk(reasoning="think"))
    rec.feed(9, chat_chunk("answer"))
    assert rec.first_token_ns == 5 and rec.first_content_ns == 9
    assert (rec.reasoning_chunks, rec.content_chunks) == (1, 1)
    assert rec.text == "answer"


def test_crlf_line_endings_and_multiline_data():
    rec = started()
    body = chat_chunk("x").replace(b"\n", b"\r\n")
    rec.feed(1, body[:-1])
    rec.feed(2, body[-1:])
    assert rec.chunk_ns == [2]
    rec2 = started()
    rec2.feed(1, b': ping\n\ndata: {"choices":[{"text":"t"}]}\n\n')
    assert rec2.text == "t"


def test_malformed_event_is_an_error_on_the_record():
    rec = started()
    rec.feed(1, chat_chunk("a") + b"data: {not json\n\n" + chat_chunk("b"))
    assert rec.error and rec.error.startswith("malformed SSE event")
    assert rec.chunk_ns == [1, 1]


def test_error_status_and_unstreamed_body_are_errors_with_the_server_message():
    rec = StreamRecorder()
    rec.start(429, "application/json")
    rec.feed(1, b'{"error": {"message": "Too many requests", "type": "x"}}')
    rec.close(2)
    assert rec.error == "HTTP 429: Too many requests"
    plain = StreamRecorder()
    plain.start(200, "application/json")
    plain.feed(1, b'{"choices": [{"message": {"content": "hi"}}]}')
    plain.close(2)
    assert plain.error is not None and plain.error.startswith("server did not stream")


def test_error_event_mid_stream():
    rec = started()
    rec.feed(1, chat_chunk("a") + b'data: {"error": {"message": "engine died"}}\n\n')
    assert rec.error == "error event: engine died"


def test_last_event_without_blank_line_still_counts():
    rec = started()
    rec.feed(1, chat_chunk("a") + chat_chunk("b")[:-2])
    rec.close(5)
    assert rec.chunk_ns == [1, 5]
