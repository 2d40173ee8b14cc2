"""Shared pieces of the eval tests: the project's own GSM8K fixture and a scripted OpenAI server.

The scripted server answers each completion with whatever the test's `respond` function
returns for the request body, so a test can hand the runner any reply it likes (a right
answer, an empty one, a cut-off tool call, an HTTP 500, a body that is not JSON) and check
what was recorded. It also serves files under /files/ for the download tests. It binds
127.0.0.1 only and stops with the test.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"
GSM8K_FIXTURE = DATA / "gsm8k_mini.jsonl"
GSM8K_FIXTURE_SHA256 = "f29624759334c7f1ec297386439ff371de05287dc9a402615cc3d95c36956687"
REAL_GSM8K = Path(__file__).resolve().parents[4] / "shared" / "data" / "gsm8k" / "test.jsonl"

# (status, body bytes, content type)
Response = tuple[int, bytes, str]
Respond = Callable[[dict[str, Any]], Response]


def chat_response(
    content: str | None = "",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str = "stop",
    completion_tokens: int = 10,
) -> Response:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": call}
            for i, call in enumerate(tool_calls)
        ]
    body = {
        "id": "cmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": 20,
            "completion_tokens": completion_tokens,
            "total_tokens": 20 + completion_tokens,
        },
    }
    return 200, json.dumps(body).encode(), "application/json"


def user_text(body: dict[str, Any]) -> str:
    """The last user message of a chat body (or the prompt of a completions body)."""
    if "prompt" in body:
        return str(body["prompt"])
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


@dataclass
class ScriptedServer:
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


@contextmanager
def scripted_server(
    respond: Respond, files: dict[str, bytes] | None = None
) -> Iterator[ScriptedServer]:
    files = files or {}
    state: ScriptedServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args: object) -> None:  # keep pytest output clean
            return

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, b'{"data": [{"id": "scripted"}]}', "application/json")
            elif self.path.startswith("/files/") and self.path[7:] in files:
                self._send(200, files[self.path[7:]], "application/octet-stream")
            else:
                self._send(404, b"not found", "text/plain")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            state.requests.append(body)
            state.paths.append(self.path)
            self._send(*respond(body))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state = ScriptedServer(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def gsm8k_fixture() -> Path:
    return GSM8K_FIXTURE
