"""keyturn.http.http11: uvicorn's HTTP protocol with a response's head and
body in one socket write, over a real uvicorn server and a real socket. The
bytes on the wire are uvicorn's own; a streamed response still goes out part
by part, and a WebSocket upgrade still gets the socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
import websockets

from keyturn.http.http11 import HTTP
from keyturn.ops.serverproc import bound_socket
from tests.support.transports import Recording

WRITES: list[bytes] = []
RELEASE: asyncio.Event | None = None


class CountedHTTP(HTTP):
    """The protocol under test, over a transport that records each write."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(Recording(transport, WRITES))  # type: ignore[arg-type]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        message = await receive()
        await send({"type": "websocket.send", "text": "echo " + message["text"]})
        await send({"type": "websocket.close"})
        return
    body = b'{"data":{"ok":true}}'
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
        assert RELEASE is not None
        await RELEASE.wait()
        await send({"type": "http.response.body", "body": b"second\n"})
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def port() -> AsyncIterator[int]:
    global RELEASE
    RELEASE = asyncio.Event()
    WRITES.clear()
    sock = bound_socket()
    config = uvicorn.Config(app, http=CountedHTTP, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # it failed to start: say why
        await asyncio.sleep(0.01)
    try:
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def _read_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


async def test_each_response_of_a_kept_alive_connection_is_one_write(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(3):
            writer.write(b"POST /graphql HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
            response = await asyncio.wait_for(_read_response(reader), 5)
            assert response.startswith(b"HTTP/1.1 200 OK\r\n")
            assert response.endswith(b'\r\n\r\n{"data":{"ok":true}}')
    finally:
        writer.close()
    assert len(WRITES) == 3, WRITES
    assert all(w.startswith(b"HTTP/1.1 200 OK") and w.endswith(b"true}}") for w in WRITES)


async def test_a_streamed_response_sends_its_parts_as_they_come(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert b"transfer-encoding: chunked" in head
        # The first part arrives while the application still holds the second.
        assert await asyncio.wait_for(reader.readuntil(b"first\n\r\n"), 5)
        assert RELEASE is not None
        RELEASE.set()
        assert (await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)).endswith(
            b"second\n\r\n0\r\n\r\n"
        )
    finally:
        writer.close()


async def test_a_websocket_upgrade_is_answered_over_the_socket(port: int) -> None:
    async with websockets.connect(f"ws://127.0.0.1:{port}/graphql") as ws:
        await ws.send("hello")
        assert await asyncio.wait_for(ws.recv(), 5) == "echo hello"
