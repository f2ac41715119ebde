"""The HTTP front door of /graphql: tokens, body size and content types (CSRF).

Everything here answers before GraphQL runs, so a refused request costs no
parsing and writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keyturn.errors import DatabaseUnavailable
from keyturn.runtime.auth import Authenticator

log = logging.getLogger(__name__)


def bearer_token(value: str | None) -> str | None:
    """``Bearer X`` → ``X``; a bare token is accepted too."""
    if not value:
        return None
    scheme, _, rest = value.strip().partition(" ")
    if rest and scheme.lower() == "bearer":
        return rest.strip() or None
    return None if rest else scheme


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def _json_error(
    send: Send, status: int, message: str, code: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    # The same shape as GraphQL's own errors: extensions.code, and whether a
    # retry (with the same idempotency key) may succeed.
    extensions = {"code": code, "retryable": status == 503}
    body = orjson.dumps({"errors": [{"message": message, "extensions": extensions}]})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Guard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        state: dict[str, Any],
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self.state = state  # holds the Authenticator once the app has started
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/graphql" and scope["method"] == "POST":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket" and scope["path"] == "/graphql":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        content_type = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            # text/plain, forms and multipart are "simple" requests a browser
            # sends cross-site without a preflight: refusing them stops CSRF.
            await _json_error(
                send,
                415,
                "POST /graphql takes Content-Type: application/json",
                "UNSUPPORTED_MEDIA_TYPE",
            )
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _json_error(
                send, 413, f"request body over {self.max_body_bytes} bytes", "PAYLOAD_TOO_LARGE"
            )
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                await _json_error(
                    send, 413, f"request body over {self.max_body_bytes} bytes", "PAYLOAD_TOO_LARGE"
                )
                return
            if not message.get("more_body", False):
                break

        auth: Authenticator = self.state["auth"]
        try:
            tenant = ""
            if await auth.required():
                found = await auth.tenant_for(bearer_token(_header(scope, b"authorization")))
                if found is None:
                    await _json_error(
                        send,
                        401,
                        "missing or invalid API token",
                        "UNAUTHENTICATED",
                        [(b"www-authenticate", b'Bearer realm="keyturn"')],
                    )
                    return
                tenant = found
        except DatabaseUnavailable:
            await _json_error(
                send,
                503,
                "the database did not answer; retry",
                "UNAVAILABLE",
                [(b"retry-after", b"1")],
            )
            return
        scope.setdefault("state", {})["tenant"] = tenant

        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The Origin of browser WebSockets is checked by Strawberry (same origin,
        # or on KEYTURN_ALLOWED_ORIGINS); here we only forget the connection's
        # token once it ends.
        try:
            await self.app(scope, receive, send)
        finally:
            auth: Authenticator | None = self.state.get("auth")
            if auth is not None:
                auth.unwatch(id(scope))
