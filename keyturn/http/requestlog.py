"""A request id for every HTTP request and WebSocket connection.

An incoming ``X-Request-ID`` is kept when it looks like an id (at most 128 of
``A-Z a-z 0-9 . _ : -``), else a new one is made. The id is in every log line
written while the request runs (a context variable read by the log
formatters), in the ``X-Request-ID`` response header, and in one access line
per HTTP request (logger ``keyturn.http.requestlog``).
"""

from __future__ import annotations

import logging
import os
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keyturn.logs import REQUEST_ID

log = logging.getLogger(__name__)

_SANE = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
_QUIET = frozenset({"/healthz", "/readyz", "/metrics"})


def _incoming(scope: Scope) -> str | None:
    for key, value in scope.get("headers", []):
        if key == b"x-request-id":
            return value.decode() if _SANE.fullmatch(value) else None
    return None


def request_id(scope: Scope) -> str:
    """The request's own id when it sent one that looks like an id, else a new
    one: 128 random bits in hex, as long as a UUID's hex (a UUID object
    was a fortieth of a replay's CPU, for bits nothing reads as a UUID)."""
    return _incoming(scope) or os.urandom(16).hex()


class RequestLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)
        header = (b"x-request-id", rid.encode())
        status = 0
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] in ("http.response.start", "websocket.accept"):
                status = int(message.get("status", 101))
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        token = REQUEST_ID.set(rid)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if (
                scope["type"] == "http"
                and scope["path"] not in _QUIET
                and log.isEnabledFor(logging.INFO)  # the line's fields, only if written
            ):
                log.info(
                    "%s %s %s",
                    scope["method"],
                    scope["path"],
                    status,
                    extra={
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                    },
                )
            REQUEST_ID.reset(token)
