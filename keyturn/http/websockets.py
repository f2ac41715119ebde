"""uvicorn's WebSocket protocol (websockets' sans-I/O implementation, the one
uvicorn picks by itself), holding less for each open connection.

An idle subscription is mostly what its connection keeps, and a server keeps
a thousand of them: uvicorn's protocol keeps the handshake's request and
response (their headers, a list per header) for the connection's life, an
:class:`asyncio.Queue` for the messages the application has not read yet
(three deques and an Event, each deque over 600 bytes) and an
:class:`asyncio.Event` to wait for the socket to drain (another deque). Here
the handshake is dropped once answered, and the queue and the flag are made
of one list and one future, made only when something waits. What the
protocol does is unchanged: the same frames, limits, pings and closes.

It also writes less often. uvicorn writes each frame to the socket as it
is sent, and on loopback or a LAN a socket write is most of what sending
costs: a subscription's last answer is two frames (``next``, then
``complete``), and when a turn ends its thousand listeners are two thousand
writes, a quarter of the process's time while it delivers them (measured,
py-spy). Here the frames sent in one pass of the event loop go out in one
write at its end, in the order they were sent (keyturn.http.transport).

``keyturn serve`` runs with it (keyturn.ops.serving names it to uvicorn).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request

from keyturn.http.transport import Coalesced


class _Inbox:
    """The part of :class:`asyncio.Queue` uvicorn uses (``put_nowait``,
    ``get``, ``empty``), for its one reader: the application's ``receive``,
    which ASGI calls once at a time."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> Any:
        while not self._items:
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        return self._items.pop(0)


class _Flag:
    """The part of :class:`asyncio.Event` uvicorn uses for "the socket can
    take more" (``set``, ``clear``, ``wait``); the waiters, several when
    operations of one connection send at once while it is full, are kept
    only while it is."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        if self._set:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
        return True


class WebSockets(WebSocketsSansIOProtocol):
    # Slots for every attribute uvicorn's protocol sets (uvicorn 0.54): it
    # sets 37, past what an instance's shared-key dict holds, so each
    # connection had a dict of its own (1.5 KiB). One a later version adds
    # goes to the instance's dict, as before.
    __slots__ = (
        "app",
        "app_state",
        "asgi_version",
        "client",
        "close_sent",
        "close_timeout",
        "close_timer",
        "config",
        "conn",
        "connections",
        "curr_msg_data_type",
        "default_headers",
        "disconnected",
        "frames",
        "handshake_complete",
        "handshake_initiated",
        "initial_response",
        "last_ping_rtt",
        "logger",
        "loop",
        "pending_ping_payload",
        "ping_interval",
        "ping_sent_at",
        "ping_timeout",
        "ping_timer",
        "pong_timer",
        "queue",
        "read_paused",
        "request",
        "response",
        "root_path",
        "scheme",
        "scope",
        "server",
        "tasks",
        "transport",
        "writable",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = _Inbox()  # type: ignore[assignment]
        self.writable = _Flag()  # type: ignore[assignment]
        self.writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.transport = Coalesced(cast(asyncio.Transport, transport), self.loop)  # type: ignore[assignment]

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        # The ASGI scope has what the application reads of the request. The
        # request stays referred to by websockets' parser (a local of its
        # generator) for the connection's life: emptied, it keeps none of
        # its headers.
        event.headers.clear()
        with contextlib.suppress(AttributeError):
            del self.request

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.accept" and self.handshake_complete:
            # Sent: the 101 response is not read again.
            with contextlib.suppress(AttributeError):
                del self.response
