"""API tokens: only a hash of each secret is stored."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from keyturn.db.engine import Conn
from keyturn.db.failures import DRIVER_ERRORS, violated
from keyturn.db.sql import Statement
from keyturn.errors import TokenNameTaken


@dataclass(frozen=True, slots=True)
class TokenInfo:
    name: str
    tenant: str
    created_at: datetime
    revoked_at: datetime | None


_INSERT = Statement(
    "INSERT INTO api_tokens (id, name, tenant, token_hash) VALUES (:id, :name, :tenant, :hash)"
)
_LIST = Statement("SELECT name, tenant, created_at, revoked_at FROM api_tokens ORDER BY created_at")
_REVOKE = Statement(
    "UPDATE api_tokens SET revoked_at = now() WHERE name = :name AND revoked_at IS NULL "
    "RETURNING name"
)
_ANY = Statement("SELECT EXISTS (SELECT 1 FROM api_tokens)")
_ACTIVE = Statement("SELECT tenant FROM api_tokens WHERE token_hash = :hash AND revoked_at IS NULL")
_STILL_ACTIVE = Statement(
    "SELECT token_hash FROM api_tokens WHERE token_hash = ANY(:hashes) AND revoked_at IS NULL"
)


async def create(conn: Conn, *, name: str, tenant: str, token_hash: str) -> None:
    try:
        await _INSERT.execute(conn, id=uuid.uuid4(), name=name, tenant=tenant, hash=token_hash)
    except DRIVER_ERRORS as error:
        if violated(error) is not None:
            raise TokenNameTaken(f"a token named {name!r} exists already") from error
        raise


async def list_all(conn: Conn) -> list[TokenInfo]:
    return [
        TokenInfo(r["name"], r["tenant"], r["created_at"], r["revoked_at"])
        for r in await _LIST.fetch(conn)
    ]


async def revoke(conn: Conn, *, name: str) -> bool:
    return await _REVOKE.fetchval(conn, name=name) is not None


async def any_exist(conn: Conn) -> bool:
    """Once any token was ever created, the server requires one (revoking the
    last token must not open it up)."""
    return bool(await _ANY.fetchval(conn))


async def tenant_of(conn: Conn, *, token_hash: str) -> str | None:
    tenant = await _ACTIVE.fetchval(conn, hash=token_hash)
    return str(tenant) if tenant is not None else None


async def still_active(conn: Conn, *, hashes: Sequence[str]) -> set[str]:
    rows = await _STILL_ACTIVE.fetch(conn, hashes=list(hashes))
    return {str(r["token_hash"]) for r in rows}
