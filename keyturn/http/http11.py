"""uvicorn's HTTP/1.1 protocol (httptools), writing each response once.

uvicorn writes a response's status line and headers when the application
starts it and the body when it sends it: two socket writes for every
answer, and for a replayed submitTurn the writes were most of what the
server spent outside Python (py-spy, --native). Here both go out in one
write at the end of the event loop's pass (keyturn.http.transport); a
streamed response's parts still go out as they are sent, one pass later
at most. A connection upgraded to a WebSocket is handed the socket's own
transport: its protocol (keyturn.http.websockets) coalesces for itself.

``keyturn serve`` runs with it (keyturn.ops.serving names it to uvicorn).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from keyturn.http.transport import Coalesced


class HTTP(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._socket_transport = transport
        self.transport = Coalesced(transport, self.loop)  # type: ignore[assignment]

    def handle_websocket_upgrade(self) -> None:
        # Nothing of this connection's HTTP is pending: the upgrade request
        # is its last, and its answer is the WebSocket protocol's to write.
        self.transport.flush()  # type: ignore[attr-defined]
        self.transport = self._socket_transport
        super().handle_websocket_upgrade()
