"""Readiness after health 200: the first real completion, its time, and what is not one.

Against the scripted reference server (timing; its "tok tok tok" text is itself degenerate,
and the check says so), and against a tiny server written here that answers health 200
while it serves HTTP 500s, then `: ok: ok: ok`, then real text: the seeds' two failures.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from agent.readiness import (
    READY_POLL_S,
    NotReadyError,
    ReadyResult,
    looks_degenerate,
    wait_ready_sync,
)
from contract.suite import RequestSettings
from engines.recipes import get_recipe, render
from refserver import reference_server

# -- the degenerate-output check ------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n ",
        ": ok: ok: ok",
        ": ok: ok: ok: ok: ok: ok: ok: ok: ok: ok: ok: ok",
        "tok tok tok tok tok tok tok tok tok tok tok tok",
        "the the the the the the the the the the the",
        "Hello! Hello! Hello! Hello!",
        "................................................",
        "ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok",
    ],
)
def test_degenerate_replies_are_caught(text: str):
    assert looks_degenerate(text) is not None


@pytest.mark.parametrize(
    "text",
    [
        "Hi",
        "Hello!",
        "Red, blue and green; and a cat.",
        "Crimson, teal and ochre, and a heron standing in the shallows.",
        'i]<9`vtyU"{K*Xy{]~O$;LiCV K!}! r',  # the tiny random model's kind of reply
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
        "ha ha",
    ],
)
def test_real_replies_pass(text: str):
    assert looks_degenerate(text) is None


# -- a tiny server with a script: health 200 always, completions as scripted ---------


class _Script:
    """What each successive completion request gets: 'http500', 'ok-loop', 'reasoning', 'good'."""

    def __init__(self, steps: list[str], then: str) -> None:
        self.steps = list(steps)
        self.then = then
        self.bodies: list[dict[str, object]] = []
        self.lock = threading.Lock()

    def next(self, body: dict[str, object]) -> str:
        with self.lock:
            self.bodies.append(body)
            return self.steps.pop(0) if self.steps else self.then


GOOD = "Crimson, teal and ochre, and a heron."
LOOP = ": ok: ok: ok: ok: ok: ok"


def _handler(script: _Script) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _json(self, status: int, payload: object) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": "scripted"}]})
            else:
                self._json(404, {"error": "not found"})

        def _chunk(self, payload: object) -> None:
            data = f"data: {json.dumps(payload)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/chat/completions":
                self._json(404, {"error": "not found"})
                return
            step = script.next(body)
            if step == "http500":
                self._json(500, {"error": {"message": "jinja2 missing", "code": 500}})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            field = "reasoning_content" if step == "reasoning" else "content"
            text = {"good": GOOD, "ok-loop": LOOP, "reasoning": "Let me think."}[step]
            words = text.split(" ")
            for i, word in enumerate(words):
                piece = word if i == 0 else " " + word
                self._chunk({"choices": [{"index": 0, "delta": {field: piece}}]})
            self._chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            self._chunk(
                {
                    "choices": [],
                    "usage": {"prompt_tokens": 9, "completion_tokens": len(words)},
                }
            )
            done = b"data: [DONE]\n\n"
            self.wfile.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
            self.wfile.flush()

    return Handler


@contextmanager
def scripted_server(steps: list[str], then: str = "good") -> Iterator[tuple[str, _Script]]:
    script = _Script(steps, then)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# -- readiness against the scripted server --------------------------------------------


def test_health_200_while_generations_fail_then_loop_then_work():
    with scripted_server(["http500", "http500", "ok-loop", "ok-loop"]) as (url, script):
        started = time.monotonic()
        result = wait_ready_sync(url, engine="scripted", timeout_s=20.0, health_s=1.25)
        elapsed = time.monotonic() - started
    assert result.ok, result
    assert result.attempts == 5 and result.rejected == 4
    assert result.text == GOOD
    assert result.health_s == 1.25
    assert result.first_completion_s is not None and result.ready_s is not None
    assert result.ready_s == pytest.approx(result.health_s + result.first_completion_s)
    # Polled every 0.5 s: four failed attempts mean at least four waits.
    assert result.first_completion_s >= 4 * READY_POLL_S * 0.9
    assert result.first_completion_s <= elapsed
    assert any("HTTP 500" in p for p in result.problems)
    assert any("degenerate" in p and "ok" in p for p in result.problems)
    assert len(script.bodies) == 5


def test_a_server_that_only_loops_is_never_ready():
    with scripted_server([], then="ok-loop") as (url, _script):
        result = wait_ready_sync(url, engine="looping", timeout_s=1.6)
    assert not result.ok
    assert result.first_completion_s is None and result.ready_s is None
    assert "degenerate" in (result.reason or "") or "timed out" in (result.reason or "")
    assert any("one short unit repeated" in p for p in result.problems)
    # Bounded: about timeout / poll attempts, never a busy loop.
    assert 2 <= result.attempts <= int(1.6 / READY_POLL_S) + 2
    with pytest.raises(NotReadyError, match=r"^looping: not ready after"):
        result.require()


def test_a_server_whose_generations_all_fail_is_never_ready():
    with scripted_server([], then="http500") as (url, _script):
        result = wait_ready_sync(url, engine="failing", timeout_s=1.2)
    assert not result.ok and "HTTP 500" in " ".join(result.problems)


def test_reasoning_without_content_is_not_ready():
    with scripted_server(["reasoning"]) as (url, _script):
        result = wait_ready_sync(url, engine="thinking", timeout_s=10.0)
    assert result.ok and result.attempts == 2
    assert any("reasoning only" in p for p in result.problems)


def test_a_dead_server_stops_the_wait_at_once():
    with scripted_server([], then="http500") as (url, _script):
        started = time.monotonic()
        result = wait_ready_sync(url, engine="dead", timeout_s=30.0, alive=lambda: False)
    assert not result.ok and result.reason == "server process exited"
    assert time.monotonic() - started < 5.0


def test_the_engines_request_extras_are_sent_and_output_is_not_forced():
    served = render(get_recipe("llamacpp"), "llama", None, "tiny.gguf")
    with scripted_server([]) as (url, script):
        result = wait_ready_sync(
            url, engine="llamacpp", timeout_s=10.0, settings=served.request_settings()
        )
    assert result.ok
    (body,) = script.bodies
    assert body["cache_prompt"] is False
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "ignore_eos" not in body and "min_tokens" not in body
    assert body["model"] == "scripted"


def test_the_result_is_a_typed_record():
    with scripted_server([]) as (url, _script):
        result = wait_ready_sync(url, engine="scripted", timeout_s=10.0)
    assert isinstance(result, ReadyResult)
    again = ReadyResult.model_validate(json.loads(result.model_dump_json()))
    assert again == result
    with pytest.raises(ValueError, match="extra"):
        ReadyResult.model_validate({**result.model_dump(), "surprise": 1})


# -- readiness against the reference server -------------------------------------------


def test_reference_server_first_completion_is_timed():
    with reference_server(ttft_ms=200, itl_ms=5) as server:
        result = wait_ready_sync(
            server.url, engine="reference", timeout_s=20.0, check=None, health_s=0.0
        )
        (record,) = server.ground_truth()
    assert result.ok and result.attempts == 1
    assert result.first_completion_s is not None
    # The scripted 200 ms to the first token is inside the measured time.
    assert result.first_completion_s >= 0.2
    assert record.outcome == "ok"


def test_reference_server_text_is_degenerate_and_the_check_says_so():
    # The reference server's every token is "tok ": a loop by design, which the default
    # check must refuse (a true positive, not a flaky server).
    with reference_server(ttft_ms=1, itl_ms=1) as server:
        result = wait_ready_sync(
            server.url, engine="reference", timeout_s=1.2, settings=RequestSettings()
        )
    assert not result.ok
    assert any("tok" in p for p in result.problems)
