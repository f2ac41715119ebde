"""Looking at the record directly, beside what the API says."""

from __future__ import annotations

import uuid
from typing import Any

from keyturn.db.engine import raw_connect, with_database

__all__ = ["admin", "counts", "new_key", "with_database"]


async def admin(url: str) -> Any:
    """A plain asyncpg connection, for checking (or arranging) the record;
    the URL is read as Keyturn reads it (sslmode and the rest)."""
    return await raw_connect(url)


async def counts(db: Any, session_id: str) -> tuple[int, int, int]:
    """(turns, turn.started events, the session's seq counter) straight from the tables."""
    turns = await db.fetchval("SELECT count(*) FROM turns WHERE session_id = $1::uuid", session_id)
    started = await db.fetchval(
        "SELECT count(*) FROM events WHERE session_id = $1::uuid AND type = 'turn.started'",
        session_id,
    )
    seq = await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1::uuid", session_id)
    return turns, started, seq


def new_key() -> str:
    return f"key-{uuid.uuid4()}"
