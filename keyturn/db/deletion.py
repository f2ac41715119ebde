"""Deleting a session: its turns, events (the tool ledger with them),
resolutions, tombstones and keys, in one transaction; its deletion key is what remains.

The session row is locked first (FOR UPDATE), as admission, the claim and
every event append lock it, so none of them can interleave: whatever they
committed before the lock is deleted here, and whatever waits for the lock
finds no session once it is released. Each statement after the lock reads
afresh (READ COMMITTED), so a turn admitted while the lock was awaited is
seen and deleted, never left behind.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import Enum

from keyturn.db.engine import Conn
from keyturn.db.sql import Statement, literal
from keyturn.domain import TurnStatus

_DELETED_UNDER = Statement(
    "SELECT session_id FROM session_deletions WHERE tenant = :tenant AND idempotency_key = :key"
)
_LOCK = Statement("SELECT id FROM sessions WHERE id = :id AND tenant = :tenant FOR UPDATE")
_RUNNING = Statement(
    f"SELECT id FROM turns WHERE session_id = :id AND status = {literal(TurnStatus.RUNNING)}"
)
_CLAIM_KEY = Statement(
    "INSERT INTO session_deletions (tenant, idempotency_key, session_id) "
    "VALUES (:tenant, :key, :id) ON CONFLICT DO NOTHING RETURNING session_id"
)


def _count_deleted(table: str, column: str) -> Statement:
    return Statement(
        f"WITH d AS (DELETE FROM {table} WHERE {column} = :id RETURNING 1) SELECT count(*) FROM d"
    )


# Children before parents: events and resolutions name turns, turns name the
# session (and each other, retry_of: one statement deletes both ends). The
# keys (and the tombstones of pruned turns) would go with the session (ON
# DELETE CASCADE); they are deleted here so that their count is logged with the rest.
_DELETES = tuple(
    (table, _count_deleted(table, column))
    for table, column in (
        ("events", "session_id"),
        ("resolutions", "session_id"),
        ("turns", "session_id"),
        ("key_tombstones", "session_id"),
        ("session_keys", "session_id"),
        ("sessions", "id"),
    )
)


class Removed(Enum):
    REMOVED = "removed"
    SESSION_NOT_FOUND = "session_not_found"  # none under this tenant (or deleted meanwhile)
    BUSY = "busy"  # a turn of the session is RUNNING: nothing was written
    KEY_TAKEN = "key_taken"  # another deletion holds the key: nothing was written


@dataclass(frozen=True, slots=True)
class Removal:
    outcome: Removed
    running_turn_id: uuid.UUID | None = None
    # Rows deleted, by table.
    rows: dict[str, int] = field(default_factory=dict)


async def deleted_under(conn: Conn, *, tenant: str, key: str) -> uuid.UUID | None:
    """The session a deletion under ``key`` removed, if any."""
    found: uuid.UUID | None = await _DELETED_UNDER.fetchval(conn, tenant=tenant, key=key)
    return found


async def delete_session(conn: Conn, *, tenant: str, session_id: uuid.UUID, key: str) -> Removal:
    async with conn.driver.transaction():
        if await _LOCK.fetchrow(conn, id=session_id, tenant=tenant) is None:
            return Removal(Removed.SESSION_NOT_FOUND)
        # Under the lock no claim can start a turn, and a running one cannot end.
        running = await _RUNNING.fetchval(conn, id=session_id)
        if running is not None:
            return Removal(Removed.BUSY, running_turn_id=running)
        if await _CLAIM_KEY.fetchval(conn, tenant=tenant, key=key, id=session_id) is None:
            return Removal(Removed.KEY_TAKEN)
        rows = {name: int(await stmt.fetchval(conn, id=session_id)) for name, stmt in _DELETES}
    return Removal(Removed.REMOVED, rows=rows)
