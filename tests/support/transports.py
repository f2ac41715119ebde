"""A real transport that records each write reaching the socket, for the
tests that count how often a protocol writes."""

from __future__ import annotations

import asyncio


class Recording:
    """The transport's own behaviour, and each ``write`` kept in ``writes``
    (a list given by the caller when the protocol is made by someone else)."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes] | None = None) -> None:
        self.transport = transport
        self.writes: list[bytes] = [] if writes is None else writes

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self.transport, name)
