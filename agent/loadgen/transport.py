"""HTTP transports for streaming requests: the measured hot path.

Two implementations of one small interface, `Transport.stream(path, body, recorder)`:

- `FastTransport`: raw non-blocking sockets on the event loop + httptools (llhttp, the
  parser uvicorn uses), a pool of keep-alive HTTP/1.1 connections, one per concurrent
  stream. Each read carries the kernel's receive time stamp, taken before any parsing, so
  every event of a read gets the time its bytes arrived, however busy the loop was.
  This is the default: benchmarks/client_capacity.py measures why (httpx's per-chunk
  cost on one core caps it far below what a 64-stream sweep needs).
- `HttpxTransport`: the same over httpx.AsyncClient, for https URLs and as the comparison.

Both report the send time taken just before the request bytes are written, and never raise
for a failed request: the error lands on the recorder.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import urlsplit

import httptools
import httpx

from agent.loadgen.sse import StreamRecorder

__all__ = ["FastTransport", "HttpxTransport", "StreamResult", "Transport", "make_transport"]

TransportName = Literal["fast", "httpx"]


@dataclass(frozen=True, slots=True)
class StreamResult:
    send_ns: int
    end_ns: int


class Transport(Protocol):
    async def stream(
        self,
        path: str,
        body: bytes,
        recorder: StreamRecorder,
        timeout_s: float,
        request_id: str = "",
    ) -> StreamResult: ...

    async def warm(self, connections: int) -> None: ...

    async def aclose(self) -> None: ...


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


_READ_BYTES = 256 * 1024
# SO_TIMESTAMPNS / SCM_TIMESTAMPNS (Linux asm-generic value; Python's socket module lacks it).
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_CMSG_BYTES = socket.CMSG_SPACE(16)
_TIMESPEC = struct.Struct("qq")
_STALE = -1
_STALE_RETRIES = 1


class _Connection:
    """One keep-alive HTTP/1.1 connection on a raw non-blocking socket; one request at a time.

    Reads use recvmsg with the kernel's receive time stamp (SO_TIMESTAMPNS, CLOCK_REALTIME)
    and convert it to perf_counter time as `now - age`: a read the event loop gets to late,
    because 63 other streams were served first, still carries the time its bytes arrived.
    Where the kernel gives no stamp, the time of the read is used.
    """

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.sock = sock
        self.loop = loop
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.keep_alive = True
        self.kernel_stamps = True
        self._recorder: StreamRecorder | None = None
        self._done: asyncio.Future[int] | None = None
        self._arrival_ns = 0
        self._content_type = ""
        self._bytes = 0
        self.served = 0
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        except OSError:
            self.kernel_stamps = False
        loop.add_reader(sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(_READ_BYTES, _CMSG_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        # Realtime first, then monotonic: any gap between the two reads makes the arrival
        # a few ns late, never early.
        real_ns = time.time_ns()
        now_ns = time.perf_counter_ns()
        arrival_ns = now_ns
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= 16:
                seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                age_ns = real_ns - (seconds * 1_000_000_000 + nanoseconds)
                if 0 <= age_ns < 60_000_000_000:
                    arrival_ns = now_ns - age_ns
        if not data:
            self._lost(None)
            return
        self._arrival_ns = arrival_ns
        self._bytes += len(data)
        if self._recorder is None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(error=f"malformed HTTP response: {exc}")

    def _lost(self, exc: Exception | None) -> None:
        if self._done is not None and not self._done.done() and self._bytes == 0 and self.served:
            # A kept-alive connection the server had already closed: nothing of this
            # request was answered, so the pool retries it on a fresh connection.
            self._recorder = None
            self._done.set_result(_STALE)
        elif self._done is not None and not self._done.done():
            self._arrival_ns = time.perf_counter_ns()
            reason = f": {exc}" if exc else ""
            self._finish(
                error=f"connection closed by server mid-response after {self._bytes} bytes{reason}"
            )
        self.abort()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self._content_type = value.decode("latin-1").lower()

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if self._recorder is not None:
            self._recorder.start(self.parser.get_status_code(), self._content_type)

    def on_body(self, body: bytes) -> None:
        if self._recorder is not None:
            self._recorder.feed(self._arrival_ns, body)

    def on_message_complete(self) -> None:
        self._finish()

    def _finish(self, error: str | None = None) -> None:
        recorder, done = self._recorder, self._done
        self._recorder = None
        if recorder is not None:
            if error is not None:
                recorder.error = recorder.error or error
                self.closed = True
            recorder.close(self._arrival_ns)
        if done is not None and not done.done():
            done.set_result(self._arrival_ns)

    async def request(
        self, data: bytes, recorder: StreamRecorder, timeout_s: float
    ) -> StreamResult | None:
        """Send one request and wait for its whole response; None if the connection was stale."""
        self._recorder = recorder
        self._done = self.loop.create_future()
        self._content_type = ""
        self._bytes = 0
        send_ns = time.perf_counter_ns()
        try:
            sent = self.sock.send(data)
            if sent < len(data):
                await self.loop.sock_sendall(self.sock, data[sent:])
        except OSError as exc:
            self._lost(exc)
        try:
            end_ns = await asyncio.wait_for(self._done, timeout_s)
        except TimeoutError:
            self._arrival_ns = time.perf_counter_ns()
            self._finish(
                error=f"timed out after {timeout_s:g} s ({len(recorder.chunk_ns)} token events)"
            )
            self.abort()
            end_ns = self._arrival_ns
        if end_ns == _STALE:
            return None
        self.served += 1
        if not self.keep_alive:
            self.abort()
        return StreamResult(send_ns=send_ns, end_ns=end_ns)

    def abort(self) -> None:
        if not self.closed or self.sock.fileno() >= 0:
            self.closed = True
            with contextlib.suppress(ValueError, OSError):
                self.loop.remove_reader(self.sock.fileno())
            self.sock.close()


class FastTransport:
    """A pool of raw keep-alive connections to one http:// origin."""

    def __init__(self, base_url: str, *, api_key: str | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise ValueError(f"FastTransport speaks plain http only, not {parts.scheme!r}")
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        host_header = f"{self._host}:{self._port}"
        header_lines = "".join(f"{k}: {v}\r\n" for k, v in _headers(api_key).items())
        self._head_template = (
            f"POST {{path}} HTTP/1.1\r\nHost: {host_header}\r\n{header_lines}"
            "X-Request-Id: {request_id}\r\nContent-Length: {length}\r\n\r\n"
        )
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        family, kind, proto, _, address = (
            await loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except OSError:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = _Connection(sock, loop)
        self._all.add(connection)
        return connection

    async def _acquire(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
            self._all.discard(connection)
        return await self._connect()

    async def warm(self, connections: int) -> None:
        """Open connections up front so no measured request pays for a handshake."""
        missing = connections - len([c for c in self._idle if not c.closed])
        opened = await asyncio.gather(
            *(self._connect() for _ in range(max(0, missing))), return_exceptions=True
        )
        self._idle.extend(c for c in opened if isinstance(c, _Connection))

    async def stream(
        self,
        path: str,
        body: bytes,
        recorder: StreamRecorder,
        timeout_s: float,
        request_id: str = "",
    ) -> StreamResult:
        head = self._head_template.format(
            path=self._prefix + path, request_id=request_id, length=len(body)
        ).encode()
        for _ in range(_STALE_RETRIES + 1):
            try:
                connection = await self._acquire()
            except OSError as exc:
                now = time.perf_counter_ns()
                recorder.error = (
                    f"cannot connect to {self._host}:{self._port}: {exc.strerror or exc}"
                )
                recorder.close(now)
                return StreamResult(send_ns=now, end_ns=now)
            result = await connection.request(head + body, recorder, timeout_s)
            if connection.closed:
                self._all.discard(connection)
            else:
                self._idle.append(connection)
            if result is not None:
                return result
        now = time.perf_counter_ns()
        recorder.error = "connection closed by server before any response (after retry)"
        recorder.close(now)
        return StreamResult(send_ns=now, end_ns=now)

    async def aclose(self) -> None:
        for connection in list(self._all):
            connection.abort()
        self._all.clear()
        self._idle.clear()


class HttpxTransport:
    """The same interface over httpx.AsyncClient (HTTP/1.1, pool sized to the streams)."""

    def __init__(self, base_url: str, *, api_key: str | None = None, max_connections: int = 64):
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=_headers(api_key),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            timeout=httpx.Timeout(None, connect=30.0),
        )

    async def warm(self, connections: int) -> None:
        async def one() -> None:
            with contextlib.suppress(httpx.HTTPError):
                await self._client.get("/health")

        await asyncio.gather(*(one() for _ in range(connections)))

    async def stream(
        self,
        path: str,
        body: bytes,
        recorder: StreamRecorder,
        timeout_s: float,
        request_id: str = "",
    ) -> StreamResult:
        headers = {"X-Request-Id": request_id}
        send_ns = time.perf_counter_ns()
        for attempt in range(_STALE_RETRIES + 1):
            send_ns = time.perf_counter_ns()
            try:
                async with asyncio.timeout(timeout_s):
                    async with self._client.stream(
                        "POST", path, content=body, headers=headers
                    ) as response:
                        recorder.start(
                            response.status_code,
                            response.headers.get("content-type", "").lower(),
                        )
                        async for chunk in response.aiter_raw():
                            recorder.feed(time.perf_counter_ns(), chunk)
            except TimeoutError:
                recorder.error = recorder.error or (
                    f"timed out after {timeout_s:g} s ({len(recorder.chunk_ns)} token events)"
                )
            except httpx.RemoteProtocolError as exc:
                # A reused keep-alive connection the server had closed: retry once, as the
                # fast transport does, but only if nothing of the response arrived.
                if recorder.http_status is None and attempt < _STALE_RETRIES:
                    continue
                recorder.error = recorder.error or f"{type(exc).__name__}: {exc}"
            except httpx.HTTPError as exc:
                recorder.error = recorder.error or f"{type(exc).__name__}: {exc}"
            break
        end_ns = time.perf_counter_ns()
        recorder.close(end_ns)
        return StreamResult(send_ns=send_ns, end_ns=end_ns)

    async def aclose(self) -> None:
        await self._client.aclose()


def make_transport(
    name: TransportName, base_url: str, *, api_key: str | None, max_connections: int
) -> Transport:
    if name == "fast" and urlsplit(base_url).scheme == "http":
        return FastTransport(base_url, api_key=api_key)
    return HttpxTransport(base_url, api_key=api_key, max_connections=max_connections)
