"""The server: HTTP/1.1 on asyncio's Protocol API, serving completions by their stream plan
and recording the ground truth."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from refserver.plan import (
    _Completion,
    _completion_prompt,
    _error_body,
    _full_body,
    _max_tokens,
    _simple_response,
    _stream_plan,
    chat_prompt_text,
    find_fault,
)
from refserver.truth import (
    _KIND_BODY,
    _KIND_ERROR,
    _TEMPLATE_HEAD_IDS,
    _TEMPLATE_TAIL_IDS,
    CHAT_TEMPLATE_OVERHEAD,
    DEFAULT_GT_MAX_CHUNKS,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MODEL,
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    GroundTruthStore,
    Pace,
    RequestError,
    _Record,
)

log = logging.getLogger(__name__)


class ReferenceServerCore:
    """Shared state: the default pace, ids, the ground-truth store and open connections."""

    def __init__(
        self,
        pace: Pace,
        model: str = DEFAULT_MODEL,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        log_path: Path | None = None,
        gt_max_chunks: int = DEFAULT_GT_MAX_CHUNKS,
    ) -> None:
        self.pace = pace
        self.model = model
        self.max_model_len = max_model_len
        self.store = GroundTruthStore(log_path, gt_max_chunks)
        self.conns: set[_Conn] = set()
        self._id_base = secrets.token_hex(4)
        self._n = 0
        self.stopping = False

    def next_id(self, chat: bool) -> str:
        self._n += 1
        return f"{'chatcmpl' if chat else 'cmpl'}-{self._id_base}{self._n:08x}"

    def protocol(self) -> _Conn:
        return _Conn(self)

    def close_all(self) -> None:
        self.stopping = True
        for conn in list(self.conns):
            conn.shutdown()


class _Conn(asyncio.Protocol):
    """One client connection: parses requests in order and runs one response at a time."""

    def __init__(self, core: ReferenceServerCore) -> None:
        self.core = core
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False
        self.closed = False
        self.paused = False
        self.keep_alive = True
        self.sent_continue = False
        # Active completion state (one at a time per connection).
        self.comp: _Completion | None = None
        self.i = 0
        self.j = 0
        self.t0 = 0.0
        self.handle: asyncio.Handle | None = None
        self.waiting_resume = False

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.core.conns.add(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._process()

    def eof_received(self) -> bool | None:
        # A half-closed client may still read the response, so a response in progress
        # finishes first; a stalled one never would, and is what a timed-out client leaves.
        self.keep_alive = False
        comp = self.comp
        if not self.busy or (
            comp is not None and comp.tail == "stall" and self.i >= len(comp.plan)
        ):
            self._close()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.core.conns.discard(self)
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        comp = self.comp
        if comp is not None:
            self.comp = None
            rec = comp.rec
            if rec.outcome == "in_progress":
                rec.outcome = "server_stopped" if self.core.stopping else "client_closed"
            self._finish_record(rec)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.waiting_resume:
            self.waiting_resume = False
            self.handle = self.loop.call_soon(self._step)

    # -- request parsing ---------------------------------------------------------------

    def _process(self) -> None:
        buf = self.buf
        while not self.busy and not self.closed and buf:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEADER_BYTES:
                    self._fail(431, "request headers too large")
                return
            try:
                head = bytes(buf[:end]).decode("latin-1")
                lines = head.split("\r\n")
                method, target, version = lines[0].split(" ", 2)
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if not sep:
                        raise ValueError(f"bad header line {line[:60]!r}")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                if length < 0:
                    raise ValueError("negative content-length")
            except ValueError as e:
                self._fail(400, f"malformed request: {e}")
                return
            if "transfer-encoding" in headers:
                self._fail(411, "chunked request bodies are not supported; send Content-Length")
                return
            if length > MAX_BODY_BYTES:
                self._fail(413, f"request body over {MAX_BODY_BYTES} bytes")
                return
            total = end + 4 + length
            if len(buf) < total:
                expect = headers.get("expect", "").lower()
                if expect == "100-continue" and not self.sent_continue and self.transport:
                    self.sent_continue = True
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                return
            self.sent_continue = False
            body = bytes(buf[end + 4 : total])
            del buf[:total]
            conn_hdr = headers.get("connection", "").lower()
            if version == "HTTP/1.0":
                self.keep_alive = "keep-alive" in conn_hdr
            else:
                self.keep_alive = "close" not in conn_hdr
            self._dispatch(method, target.split("?", 1)[0], headers, body)
            if not self.busy and not self.keep_alive:
                self._close()

    def _fail(self, status: int, message: str) -> None:
        """Answer a request we cannot parse and drop the connection (framing is lost)."""
        self.keep_alive = False
        self._write(
            _simple_response(status, _error_body(status, message, "BadRequestError"), False)
        )
        self._close()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def shutdown(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- routing -----------------------------------------------------------------------

    def _dispatch(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        ka = self.keep_alive
        core = self.core
        if path in ("/v1/chat/completions", "/v1/completions"):
            if method != "POST":
                self._json(405, _error_body(405, "use POST", "MethodNotAllowed"))
                return
            self._completion(path == "/v1/chat/completions", headers, body)
        elif path == "/health":
            self._json(200, b'{"status":"ok"}')
        elif path == "/v1/models":
            data = {
                "object": "list",
                "data": [
                    {
                        "id": core.model,
                        "object": "model",
                        "created": 0,
                        "owned_by": "reference-server",
                        "max_model_len": core.max_model_len,
                    }
                ],
            }
            self._json(200, json.dumps(data).encode())
        elif path == "/tokenize" and method == "POST":
            self._tokenize(body)
        elif path == "/detokenize" and method == "POST":
            self._detokenize(body)
        elif path == "/ground_truth" and method == "GET":
            extra = [("x-ground-truth-dropped", str(core.store.dropped))]
            self._write(_simple_response(200, core.store.dump(), ka, extra=extra))
        elif path == "/ground_truth/reset" and method == "POST":
            core.store.reset()
            self._json(200, b'{"status":"ok"}')
        else:
            self._json(404, _error_body(404, f"no route {method} {path}", "NotFoundError"))

    def _json(self, status: int, body: bytes) -> None:
        self._write(_simple_response(status, body, self.keep_alive))

    def _parse_json(self, body: bytes) -> dict[str, Any]:
        try:
            obj = json.loads(body)
        except ValueError as e:
            raise RequestError(400, f"body is not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise RequestError(400, "body must be a JSON object")
        return obj

    def _tokenize(self, body: bytes) -> None:
        try:
            req = self._parse_json(body)
            if "messages" in req:
                text = chat_prompt_text(req["messages"])
                tokens = _TEMPLATE_HEAD_IDS + list(text.encode("utf-8")) + _TEMPLATE_TAIL_IDS
            else:
                given = req.get("prompt", req.get("content"))
                if not isinstance(given, str):
                    raise RequestError(
                        400, "send 'prompt' (vLLM), 'content' (llama.cpp) or 'messages'"
                    )
                tokens = list(given.encode("utf-8"))
        except RequestError as e:
            self._json(e.status, _error_body(e.status, e.message, e.err_type))
            return
        out = {"tokens": tokens, "count": len(tokens), "max_model_len": self.core.max_model_len}
        self._json(200, json.dumps(out, separators=(",", ":")).encode())

    def _detokenize(self, body: bytes) -> None:
        try:
            tokens = self._parse_json(body).get("tokens")
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise RequestError(400, "'tokens' must be a list of integers")
        except RequestError as e:
            self._json(e.status, _error_body(e.status, e.message, e.err_type))
            return
        text = bytes(t for t in tokens if 0 <= t < 256).decode("utf-8", "replace")
        self._json(200, json.dumps({"prompt": text, "content": text}).encode())

    # -- completions -------------------------------------------------------------------

    def _completion(self, chat: bool, headers: dict[str, str], body: bytes) -> None:
        core = self.core
        t_recv_ns = time.perf_counter_ns()
        t0 = self.loop.time()
        rec = _Record(core.next_id(chat), t_recv_ns)
        rec.endpoint = "chat" if chat else "completions"
        rec.request_id = headers.get("x-request-id")
        rec.model = core.model
        try:
            req = self._parse_json(body)
            if isinstance(req.get("model"), str) and req["model"]:
                rec.model = req["model"]
            try:
                pace = core.pace.with_overrides(req.get("x_pace"))
            except (ValueError, TypeError) as e:
                raise RequestError(400, str(e)) from None
            rec.pace = dataclasses.asdict(pace)
            if chat:
                text = chat_prompt_text(req.get("messages"))
                rec.prompt_tokens = len(text.encode("utf-8")) + CHAT_TEMPLATE_OVERHEAD
            else:
                if "prompt" not in req:
                    raise RequestError(400, "'prompt' is required")
                text, rec.prompt_tokens = _completion_prompt(req["prompt"])
            rec.prompt_head = text[:96]
            stream = req.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestError(400, "'stream' must be true or false")
            rec.stream = stream
            opts = req.get("stream_options") or {}
            if not isinstance(opts, dict):
                raise RequestError(400, "'stream_options' must be an object")
            include_usage = bool(opts.get("include_usage", False))
            rec.max_tokens = _max_tokens(req)
            rec.fault = find_fault(text)
            self._raise_fault(rec)
            if rec.prompt_tokens + rec.max_tokens > core.max_model_len:
                raise RequestError(400, _context_message(core.max_model_len, rec))
        except RequestError as e:
            rec.status = e.status
            rec.outcome = "error"
            extra = [("retry-after", "1")] if e.status == 429 else []
            data = _simple_response(
                e.status, _error_body(e.status, e.message, e.err_type), self.keep_alive, extra=extra
            )
            rec.plan = [(data, 0, _KIND_ERROR)]
            self._write_recorded(rec, 0)
            rec.t_headers_ns = rec.times[0]
            rec.t_done_ns = rec.times[0]
            self._finish_record(rec)
            return

        created = int(time.time())
        streamed = stream and rec.fault != "nostream"
        rec.streamed = streamed
        rec.status = 200
        if streamed:
            plan, tail = _stream_plan(rec, pace, chat, include_usage, created)
            if not self.keep_alive:
                first, ntok, kind = plan[0]
                first = first.replace(b"connection: keep-alive", b"connection: close", 1)
                plan[0] = (first, ntok, kind)
        else:
            body_bytes = _full_body(rec, pace, chat, created)
            if rec.fault == "badsse":
                body_bytes = body_bytes[: len(body_bytes) // 2]  # truncated JSON
            data = _simple_response(
                200, body_bytes, self.keep_alive, extra=[("x-request-id", rec.id)]
            )
            # The whole answer goes out when its last token would have.
            plan = [(data, rec.max_tokens, _KIND_BODY)]
            tail = "end"
            if rec.fault in ("disconnect", "stall"):
                plan = []
                tail = "close" if rec.fault == "disconnect" else "stall"
        rec.plan = plan
        self.comp = _Completion(rec, pace, chat, include_usage, plan, tail, pace.itl_ms == 0)
        self.busy = True
        self.i = 0
        self.j = 0
        self.t0 = t0
        self._step()

    def _raise_fault(self, rec: _Record) -> None:
        fault = rec.fault
        if fault == "500":
            raise RequestError(500, "injected server error (FAULT:500)", "InternalServerError")
        if fault == "429":
            raise RequestError(429, "injected rate limit (FAULT:429)", "RateLimitError")
        if fault == "400":
            raise RequestError(400, "injected bad request (FAULT:400)", "BadRequestError")
        if fault == "context":
            # Claim a context just below what was asked, so the message reads like vLLM's.
            limit = max(1, min(self.core.max_model_len, rec.prompt_tokens + rec.max_tokens - 1))
            raise RequestError(400, _context_message(limit, rec))

    def _write_recorded(self, rec: _Record, k: int) -> None:
        data = rec.plan[k][0]
        t = time.perf_counter_ns()
        self._write(data)
        rec.times.append(t)

    def _step(self) -> None:
        """Write every plan entry that is due; reschedule for the next deadline.

        The hot path: entries are pre-encoded, so a chunk costs a timestamp, a write and an
        array append (and, flat out, one join per batch); no JSON is built here."""
        self.handle = None
        comp = self.comp
        if comp is None or self.closed:
            return
        plan = comp.plan
        n = len(plan)
        times = comp.rec.times
        write = self.transport.write  # type: ignore[union-attr]
        perf = time.perf_counter_ns
        i = self.i
        flat = comp.flat
        while i < n:
            if self.paused:
                self.i = i
                self.waiting_resume = True
                return
            entry = plan[i]
            if entry[1] and entry[2] != _KIND_BODY:
                if not flat or self.j == 0:
                    pace = comp.pace
                    due = self.t0 + (pace.ttft_ms + self.j * pace.itl_ms) / 1000.0
                    if due > self.loop.time():
                        self.i = i
                        self.handle = self.loop.call_at(due, self._step)
                        return
                self.j += 1
                if flat:
                    # Everything left is due now. One write per chunk costs a loopback
                    # send() each, so chunks go out flat_batch at a time, all stamped with
                    # that write's time.
                    end = min(n, i + comp.pace.flat_batch)
                    data = entry[0] if end == i + 1 else b"".join([e[0] for e in plan[i:end]])
                    t = perf()
                    write(data)
                    for _ in range(end - i):
                        times.append(t)
                    i = end
                    if i < n:
                        # Yield after each write so many flat-out streams interleave.
                        self.i = i
                        self.handle = self.loop.call_soon(self._step)
                        return
                    continue
                t = perf()
                write(entry[0])
                times.append(t)
                i += 1
                continue
            if entry[2] == _KIND_BODY:
                pace = comp.pace
                last = max(0, comp.rec.max_tokens - 1)
                due = self.t0 + (pace.ttft_ms + last * pace.itl_ms) / 1000.0
                if due > self.loop.time():
                    self.i = i
                    self.handle = self.loop.call_at(due, self._step)
                    return
            t = perf()
            write(entry[0])
            times.append(t)
            if i == 0:
                comp.rec.t_headers_ns = t
            i += 1
        self.i = i
        self._plan_done(comp)

    def _plan_done(self, comp: _Completion) -> None:
        rec = comp.rec
        if comp.tail == "stall":
            # Keep the socket open and quiet; the client's read timeout should fire.
            rec.outcome = "stall"
            self.handle = self.loop.call_later(comp.pace.stall_s, self._close)
            return
        self.comp = None
        rec.t_done_ns = time.perf_counter_ns()
        if comp.tail == "close":
            rec.outcome = "disconnect"
            self._finish_record(rec)
            # Mid-body close: the client gets the tokens so far, then EOF inside the chunked
            # body, as when an engine worker dies mid-stream.
            self.keep_alive = False
            self._close()
            return
        rec.outcome = rec.fault or "ok"
        self._finish_record(rec)
        self.busy = False
        if not self.keep_alive:
            self._close()
        elif self.buf:
            # Scheduled, not called, so pipelined requests never recurse.
            self.loop.call_soon(self._process)

    def _finish_record(self, rec: _Record) -> None:
        if rec.t_done_ns is None:
            rec.t_done_ns = time.perf_counter_ns()
        self.core.store.add(rec)


def _context_message(limit: int, rec: _Record) -> str:
    total = rec.prompt_tokens + rec.max_tokens
    return (
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{total} tokens ({rec.prompt_tokens} in the messages, {rec.max_tokens} in the "
        f"completion). Please reduce the length of the messages or completion."
    )


class _StdinWatch(asyncio.Protocol):
    """Sets ``stop`` when stdin reaches EOF."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop.set()


async def serve(
    host: str,
    port: int,
    core: ReferenceServerCore,
    on_ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
    exit_on_stdin_eof: bool = False,
) -> None:
    """Serve until ``stop`` is set, SIGTERM/SIGINT arrives (main thread only) or, with
    ``exit_on_stdin_eof``, stdin closes."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    if exit_on_stdin_eof:
        # The parent holds our stdin open; when it dies, however it dies, we follow.
        await loop.connect_read_pipe(lambda: _StdinWatch(stop), sys.stdin)
    server = await loop.create_server(core.protocol, host, port, backlog=1024, reuse_address=True)
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    bound = server.sockets[0].getsockname()[1]
    log.info("reference server listening on %s:%d", host, bound)
    if on_ready is not None:
        on_ready(bound)
    try:
        await stop.wait()
    finally:
        server.close()
        core.close_all()
        # Let the aborted connections' connection_lost run, so their records are logged.
        await asyncio.sleep(0)
        core.store.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2.0)
