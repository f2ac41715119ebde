"""Who may do what: API tokens and the tenant each one acts for.

Tokens are random secrets shown once; the record keeps their SHA-256 (a
high-entropy secret needs no slow hash). Answers are cached for a couple of
seconds per process, which bounds how long a revoked token keeps working,
and live WebSocket connections are re-checked on the same period and closed
when their token is revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from keyturn.db import tokens
from keyturn.db.engine import Engine, connect
from keyturn.db.tokens import TokenInfo
from keyturn.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

TOKEN_PREFIX = "kt_"


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_token(engine: Engine, *, name: str, tenant: str | None = None) -> str:
    """Store a new token and return its secret (the only time it is seen)."""
    secret = new_secret()
    async with connect(engine) as conn:
        await tokens.create(conn, name=name, tenant=tenant or name, token_hash=hash_token(secret))
    return secret


async def list_tokens(engine: Engine) -> list[TokenInfo]:
    async with connect(engine) as conn:
        return await tokens.list_all(conn)


async def revoke_token(engine: Engine, *, name: str) -> bool:
    async with connect(engine) as conn:
        return await tokens.revoke(conn, name=name)


async def tokens_exist(engine: Engine) -> bool:
    async with connect(engine) as conn:
        return await tokens.any_exist(conn)


Closer = Callable[[], Awaitable[None]]


class Authenticator:
    def __init__(self, engine: Engine, *, recheck_s: float = 2.0) -> None:
        self._engine = engine
        self._recheck_s = recheck_s
        self._required: tuple[float, bool] | None = None
        self._cache: dict[str, tuple[float, str | None]] = {}
        self._live: dict[int, tuple[str, Closer]] = {}
        self.closed_for_revocation = 0

    async def required(self) -> bool:
        now = time.monotonic()
        if self._required is not None and now - self._required[0] < self._recheck_s:
            return self._required[1]
        async with connect(self._engine) as conn:
            value = await tokens.any_exist(conn)
        self._required = (now, value)
        return value

    async def tenant_for(self, token: str | None) -> str | None:
        """The tenant a token acts for; None when it is missing, unknown or revoked."""
        if not token:
            return None
        digest = hash_token(token)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and now - cached[0] < self._recheck_s:
            return cached[1]
        async with connect(self._engine) as conn:
            tenant = await tokens.tenant_of(conn, token_hash=digest)
        if len(self._cache) > 10_000:
            self._cache.clear()  # bounded: unknown tokens must not grow memory
        self._cache[digest] = (now, tenant)
        return tenant

    def watch(self, key: int, token: str, close: Closer) -> None:
        """Close this live connection once its token is revoked."""
        self._live[key] = (hash_token(token), close)

    def unwatch(self, key: int) -> None:
        self._live.pop(key, None)

    async def watch_forever(self) -> None:
        """Close live connections whose token was revoked (supervised)."""
        while True:
            await asyncio.sleep(self._recheck_s)
            try:
                await self._recheck()
            except DatabaseUnavailable:
                log.warning("token re-check: database unavailable; will retry")

    async def _recheck(self) -> None:
        if self._live:
            hashes = {h for h, _ in self._live.values()}
            async with connect(self._engine) as conn:
                active = await tokens.still_active(conn, hashes=list(hashes))
            for key, (digest, close) in list(self._live.items()):
                if digest not in active:
                    self._live.pop(key, None)
                    self._cache.pop(digest, None)
                    self.closed_for_revocation += 1
                    log.info("closing a live connection: its token was revoked")
                    with contextlib.suppress(Exception):
                        await close()
