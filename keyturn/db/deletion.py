"""Deleting a session: its turns, events (the tool ledger with them),
resolutions, tombstones and keys, in one transaction; its deletion key is what remains.

The session row is locked first (FOR UPDATE), as admission, the claim and
every event append lock it, so none of them can interleave: whatever they
committed before the lock is deleted here, and whatever waits for the lock
finds no session once it is released. Each statement after the lock reads
afresh (READ COMMITTED), so a turn admitted while the lock was awaited is
seen and deleted, never left behind.

A RUNNING turn is never deleted under the process running it: that process
would go on writing for a turn that is gone. The same transaction then
cancels instead, as a multitask INTERRUPT does (:func:`keyturn.db.cancels.
cancel_active`, no key), and writes nothing else; the caller waits for the
turn to stop and tries again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import Enum

from keyturn.db import cancels
from keyturn.db.engine import Conn
from keyturn.db.records import TurnRecord
from keyturn.db.sql import Statement, literal
from keyturn.domain import TurnStatus

_DELETED_UNDER = Statement(
    "SELECT session_id FROM session_deletions WHERE tenant = :tenant AND idempotency_key = :key"
)
_LOCK = Statement("SELECT id FROM sessions WHERE id = :id AND tenant = :tenant FOR UPDATE")
_RUNNING = Statement(
    f"SELECT id FROM turns WHERE session_id = :id AND status = {literal(TurnStatus.RUNNING)}"
)
# Without a lock, while a deletion waits: NULL when no turn of the session
# runs, true when every running one has its cancel already (nothing to do
# but wait), false when one runs without (claimed meanwhile: ask it to stop).
_ONLY_STOPPING = Statement(
    "SELECT bool_and(cancel_requested_at IS NOT NULL) FROM turns"
    f" WHERE session_id = :id AND status = {literal(TurnStatus.RUNNING)}"
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
    # A turn of the session is RUNNING: every active turn without a cancel got
    # one (``cancelled``), nothing else was written.
    RUNNING = "running"
    KEY_TAKEN = "key_taken"  # another deletion holds the key: nothing was written


@dataclass(frozen=True, slots=True)
class Removal:
    outcome: Removed
    running_turn_id: uuid.UUID | None = None
    # The turns this call cancelled or asked to stop (RUNNING).
    cancelled: list[TurnRecord] = field(default_factory=list)
    # Rows deleted, by table.
    rows: dict[str, int] = field(default_factory=dict)


async def deleted_under(conn: Conn, *, tenant: str, key: str) -> uuid.UUID | None:
    """The session a deletion under ``key`` removed, if any."""
    found: uuid.UUID | None = await _DELETED_UNDER.fetchval(conn, tenant=tenant, key=key)
    return found


async def only_stopping(conn: Conn, *, session_id: uuid.UUID) -> bool:
    """True while a turn of the session runs and every running one has its
    cancel: a deletion has nothing to do yet but wait."""
    return bool(await _ONLY_STOPPING.fetchval(conn, id=session_id))


async def delete_session(
    conn: Conn, *, tenant: str, session_id: uuid.UUID, key: str, reason: str
) -> Removal:
    """Delete the session, or, while a turn of it runs, cancel its active
    turns with ``reason`` (those that have no cancel yet) and write nothing else."""
    async with conn.driver.transaction():
        if await _LOCK.fetchrow(conn, id=session_id, tenant=tenant) is None:
            return Removal(Removed.SESSION_NOT_FOUND)
        # Read under the lock: a deletion that took the key meanwhile (for
        # another session) is a conflict, and this one must not cancel anything.
        if await _DELETED_UNDER.fetchval(conn, tenant=tenant, key=key) is not None:
            return Removal(Removed.KEY_TAKEN)
        # Under the lock no claim can start a turn, and a running one cannot end.
        running = await _RUNNING.fetchval(conn, id=session_id)
        if running is not None:
            # Queued and waiting turns end here too, so that none of them is
            # claimed once the running one stops; one admitted and claimed
            # meanwhile is asked to stop by the caller's next attempt.
            cancelled = await cancels.cancel_active(
                conn, tenant=tenant, session_id=session_id, except_id=None, reason=reason
            )
            return Removal(Removed.RUNNING, running_turn_id=running, cancelled=cancelled)
        if await _CLAIM_KEY.fetchval(conn, tenant=tenant, key=key, id=session_id) is None:
            return Removal(Removed.KEY_TAKEN)
        rows = {name: int(await stmt.fetchval(conn, id=session_id)) for name, stmt in _DELETES}
    return Removal(Removed.REMOVED, rows=rows)
