"""The fast transport's connection handling against small real socket servers."""

from __future__ import annotations

import asyncio

import pytest

from agent.loadgen.sse import StreamRecorder
from agent.loadgen.transport import FastTransport, HttpxTransport

BODY = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'


def _chunked(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n"
    )


async def _serve_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers one request; closes on the next one without answering.

    That is the race an idle keep-alive timeout makes: the server drops the connection
    just as the client reuses it, so nothing of the new request is answered.
    """
    try:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(_chunked(BODY))
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()


@pytest.mark.parametrize("transport_cls", [FastTransport, HttpxTransport])
def test_connections_the_server_dropped_are_replaced_without_failing_a_request(transport_cls):
    async def run() -> list[StreamRecorder]:
        server = await asyncio.start_server(_serve_then_close, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = transport_cls(f"http://127.0.0.1:{port}")
        recorders = []
        try:
            for i in range(20):
                recorder = StreamRecorder()
                await transport.stream("/v1/chat/completions", b"{}", recorder, 5.0, f"r{i}")
                recorders.append(recorder)
        finally:
            await transport.aclose()
            await asyncio.sleep(0.05)
            server.close()
            await server.wait_closed()
        return recorders

    recorders = asyncio.run(run())
    assert [r.error for r in recorders] == [None] * 20
    assert all(r.text == "hi" and r.done for r in recorders)


def test_unreachable_port_is_an_error_on_the_record_not_an_exception():
    async def run() -> StreamRecorder:
        transport = FastTransport("http://127.0.0.1:9")
        recorder = StreamRecorder()
        await transport.stream("/v1/completions", b"{}", recorder, 5.0, "x")
        await transport.aclose()
        return recorder

    recorder = asyncio.run(run())
    assert recorder.error and recorder.error.startswith("cannot connect to 127.0.0.1:9")
