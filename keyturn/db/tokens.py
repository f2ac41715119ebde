"""API tokens: only a hash of each secret is stored."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from keyturn.errors import KeyturnError


class TokenNameTaken(KeyturnError):
    """A token with that name exists already."""


@dataclass(frozen=True, slots=True)
class TokenInfo:
    name: str
    tenant: str
    created_at: datetime
    revoked_at: datetime | None


_INSERT = text(
    "INSERT INTO api_tokens (id, name, tenant, token_hash) VALUES (:id, :name, :tenant, :hash)"
)
_LIST = text("SELECT name, tenant, created_at, revoked_at FROM api_tokens ORDER BY created_at")
_REVOKE = text(
    "UPDATE api_tokens SET revoked_at = now() WHERE name = :name AND revoked_at IS NULL "
    "RETURNING name"
)
_ANY = text("SELECT EXISTS (SELECT 1 FROM api_tokens)")
_ACTIVE = text("SELECT tenant FROM api_tokens WHERE token_hash = :hash AND revoked_at IS NULL")
_STILL_ACTIVE = text(
    "SELECT token_hash FROM api_tokens WHERE token_hash = ANY(:hashes) AND revoked_at IS NULL"
)


async def create(conn: AsyncConnection, *, name: str, tenant: str, token_hash: str) -> None:
    try:
        await conn.execute(
            _INSERT, {"id": uuid.uuid4(), "name": name, "tenant": tenant, "hash": token_hash}
        )
    except IntegrityError as error:
        raise TokenNameTaken(f"a token named {name!r} exists already") from error


async def list_all(conn: AsyncConnection) -> list[TokenInfo]:
    return [TokenInfo(*row) for row in (await conn.execute(_LIST)).all()]


async def revoke(conn: AsyncConnection, *, name: str) -> bool:
    return (await conn.execute(_REVOKE, {"name": name})).first() is not None


async def any_exist(conn: AsyncConnection) -> bool:
    """Once any token was ever created, the server requires one (revoking the
    last token must not open it up)."""
    return bool((await conn.execute(_ANY)).scalar_one())


async def tenant_of(conn: AsyncConnection, *, token_hash: str) -> str | None:
    row = (await conn.execute(_ACTIVE, {"hash": token_hash})).first()
    return str(row.tenant) if row is not None else None


async def still_active(conn: AsyncConnection, *, hashes: Sequence[str]) -> set[str]:
    rows = (await conn.execute(_STILL_ACTIVE, {"hashes": list(hashes)})).all()
    return {str(r.token_hash) for r in rows}
