"""The HTTP front door of /graphql and /metrics: tokens, body size and
content types (CSRF).

Everything here answers before GraphQL runs, so a refused request costs no
parsing and writes nothing. POST must be JSON; GET (queries only, enforced by
the view) needs the same token; the GraphiQL page itself is static HTML and
needs none.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from keyturn.errors import DatabaseUnavailable
from keyturn.http import memory
from keyturn.http.body import replaying
from keyturn.http.media import is_ide_request, query_params, response_media_type
from keyturn.runtime.auth import Authenticator

log = logging.getLogger(__name__)


class AuthorizationProblem(Exception):
    """An Authorization value that is not ``Bearer TOKEN``; the message says why."""


def bearer_token(value: str | None) -> str | None:
    """``Bearer X`` (the scheme in any case, RFC 6750) → ``X``; None when absent.

    Raises :class:`AuthorizationProblem` for any other shape: a bare token or
    another scheme is refused rather than guessed at.
    """
    if value is None or not value.strip():
        return None
    scheme, _, rest = value.strip().partition(" ")
    if not rest.strip():
        raise AuthorizationProblem(
            "the Authorization value has no scheme: send 'Authorization: Bearer TOKEN'"
        )
    if scheme.lower() != "bearer":
        raise AuthorizationProblem(
            "only the Bearer scheme is accepted: send 'Authorization: Bearer TOKEN'"
        )
    return rest.strip()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def _json_error(
    scope: Scope,
    send: Send,
    status: int,
    message: str,
    code: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    # The same shape as GraphQL's own errors: extensions.code, and whether a
    # retry (with the same idempotency key) may succeed; in the media type the
    # client asked for.
    extensions = {"code": code, "retryable": status == 503}
    body = orjson.dumps({"errors": [{"message": message, "extensions": extensions}]})
    media = response_media_type(_header(scope, b"accept"))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", media.encode()),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _unauthenticated(scope: Scope, send: Send, message: str) -> None:
    await _json_error(
        scope,
        send,
        401,
        message,
        "UNAUTHENTICATED",
        [(b"www-authenticate", b'Bearer realm="keyturn"')],
    )


class Guard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        state: dict[str, Any],
        max_body_bytes: int,
        metrics_public: bool = False,
    ) -> None:
        self.app = app
        self.state = state  # holds the Authenticator once the app has started
        self.max_body_bytes = max_body_bytes
        self.metrics_public = metrics_public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/graphql":
            if scope["method"] == "POST":
                await self._http(scope, receive, send)
            elif scope["method"] == "GET" and not is_ide_request(
                "GET", query_params(scope.get("query_string", b"")), _header(scope, b"accept") or ""
            ):
                await self._get(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        elif scope["type"] == "http" and scope["path"] == "/metrics" and not self.metrics_public:
            if await self._authenticate(scope, send) is not None:
                await self.app(scope, receive, send)
        else:
            # A WebSocket to /graphql never gets here: the app runs it before
            # its middlewares and calls websocket_closed once it ends.
            await self.app(scope, receive, send)

    async def _authenticate(self, scope: Scope, send: Send) -> str | None:
        """The caller's tenant ("" while the server is open), or None once a
        refusal has been sent."""
        auth: Authenticator = self.state["auth"]
        try:
            if not await auth.required():
                return ""
            try:
                token = bearer_token(_header(scope, b"authorization"))
            except AuthorizationProblem as problem:
                await _unauthenticated(scope, send, str(problem))
                return None
            found = await auth.tenant_for(token)
        except DatabaseUnavailable as error:
            await _json_error(
                scope,
                send,
                503,
                str(error),  # busy, or not answering: either way, retry
                "UNAVAILABLE",
                [(b"retry-after", b"1")],
            )
            return None
        if found is None:
            await _unauthenticated(scope, send, "missing or invalid API token")
        return found

    async def _get(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A query over GET: the token as for POST. The view runs only queries
        # over GET (a mutation is 405), so GET never changes anything.
        tenant = await self._authenticate(scope, send)
        if tenant is None:
            return
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared_type = _header(scope, b"content-type") or ""
        content_type = declared_type.split(";")[0].strip().lower()
        if content_type == "application/json" and not declared_type.startswith(content_type):
            # Media types are case-insensitive (RFC 9110): pass the view the
            # lower-case form it compares against.
            _, sep, params = declared_type.partition(";")
            scope["headers"] = [
                (k, (content_type + sep + params).encode("latin-1"))
                if k == b"content-type"
                else (k, v)
                for k, v in scope["headers"]
            ]
        if content_type != "application/json":
            # text/plain, forms and multipart are "simple" requests a browser
            # sends cross-site without a preflight: refusing them stops CSRF.
            await _json_error(
                scope,
                send,
                415,
                "POST /graphql takes Content-Type: application/json",
                "UNSUPPORTED_MEDIA_TYPE",
            )
            return
        too_large = f"request body over {self.max_body_bytes} bytes"
        declared = _header(scope, b"content-length")
        if (
            declared is not None
            and declared.isascii()
            and declared.isdigit()
            and int(declared) > self.max_body_bytes
        ):
            await _json_error(scope, send, 413, too_large, "PAYLOAD_TOO_LARGE")
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                await _json_error(scope, send, 413, too_large, "PAYLOAD_TOO_LARGE")
                return
            if not message.get("more_body", False):
                break

        tenant = await self._authenticate(scope, send)
        if tenant is None:
            return
        scope.setdefault("state", {})["tenant"] = tenant

        await self.app(scope, replaying(bytes(body), receive), send)


def websocket_closed(state: dict[str, Any], scope: Scope) -> None:
    """Once a WebSocket to /graphql has ended: its token is forgotten, and
    what its large messages grew is given back (the view marks a connection
    that received one, keyturn.http.memory)."""
    auth: Authenticator | None = state.get("auth")
    if auth is not None:
        auth.unwatch(id(scope))
    if memory.received_large(scope):
        memory.give_back()
