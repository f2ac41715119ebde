"""A connection's transport that writes once per pass of the event loop.

On loopback or a LAN a socket write is most of what sending costs (on a
virtual machine, each one that wakes a reader on another CPU is an exit to
the host): uvicorn writes an HTTP response's head and its body separately,
and a WebSocket's frames one by one. Through :class:`Coalesced`, what is
written in one pass goes out in one write at its end, in order.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Coalesced:
    """The connection's transport, but what is written in one pass of the
    event loop goes to the socket in one write, at its end. Closing or
    aborting sends (or drops) what is pending first, so nothing is
    reordered; everything else is the transport's own."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
