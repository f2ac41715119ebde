"""A request's body, read once and handed on again to the application."""

from __future__ import annotations

from starlette.types import Message, Receive


async def read_body(receive: Receive) -> bytes | None:
    """The request's whole body; None if the client disconnected first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the body already read given again first."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            # After the body: a streamed answer (a subscription over
            # multipart/mixed) waits here to learn that the client left.
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
