"""The admission writes: claim a key, insert the turn, append ``turn.started``.

Admission is one SQL statement in autocommit mode, so one transaction and one
round trip. The unique index on ``(session_id, idempotency_key)`` alone decides
which submission owns a key; a loser's statement returns no row and the caller
reads the winner with a separate statement.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from keyturn.db.engine import Statement
from keyturn.db.rows import TURN_COLUMNS, as_row, turn_from_row
from keyturn.db.tables import Turn

_LOOKUP = Statement(
    f"""
    SELECT s.default_history AS session_default_history,
           {", ".join("t." + c.strip() + " AS t_" + c.strip() for c in TURN_COLUMNS.split(","))}
    FROM sessions s
    LEFT JOIN turns t ON t.session_id = s.id AND t.idempotency_key = :key
    WHERE s.id = :session_id AND s.tenant = :tenant
    """
)

# The session row is locked first (FOR UPDATE), so concurrent admissions to one
# session queue on it and each reads the counter its predecessor committed: seq
# stays gapless and in commit order. A conflicting key inserts nothing, so the
# later CTEs see no row, bump nothing and append nothing.
_ADMIT = Statement(
    f"""
    WITH s AS (
        SELECT id, event_seq FROM sessions
        WHERE id = :session_id AND tenant = :tenant FOR UPDATE
    ), ins AS (
        INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history,
                           status, admit_seq)
        SELECT :turn_id, s.id, :key, :fingerprint, :input, :history, 'QUEUED', s.event_seq + 1
        FROM s
        ON CONFLICT (session_id, idempotency_key) DO NOTHING
        RETURNING {TURN_COLUMNS}
    ), bump AS (
        UPDATE sessions SET event_seq = ins.admit_seq
        FROM ins WHERE sessions.id = ins.session_id
        RETURNING sessions.event_seq
    ), ev AS (
        INSERT INTO events (session_id, turn_id, seq, type, data)
        SELECT ins.session_id, ins.id, ins.admit_seq, 'turn.started',
               CAST(:data AS jsonb) || jsonb_build_object('seq', ins.admit_seq)
        FROM ins, bump
        RETURNING seq
    )
    SELECT ins.*, ev.seq AS event_seq FROM ins, ev
    """
)

_BY_KEY = text(
    f"SELECT {TURN_COLUMNS} FROM turns WHERE session_id = :session_id AND idempotency_key = :key"
)


@dataclass(frozen=True, slots=True)
class AdmissionLookup:
    """What the record says before a write: does the session exist, and does
    the key already name a turn in it."""

    session_found: bool
    default_history: str | None
    existing: Turn | None


async def lookup(
    conn: AsyncConnection, *, tenant: str, session_id: uuid.UUID, key: str
) -> AdmissionLookup:
    row = await _LOOKUP.fetchrow(conn, tenant=tenant, session_id=session_id, key=key)
    if row is None:
        return AdmissionLookup(False, None, None)
    existing = turn_from_row(as_row(row), "t_") if row["t_id"] is not None else None
    return AdmissionLookup(True, row["session_default_history"], existing)


async def insert_turn(
    conn: AsyncConnection,
    *,
    tenant: str,
    turn_id: uuid.UUID,
    session_id: uuid.UUID,
    key: str,
    fingerprint: str,
    input: str,
    history: str,
    data: dict[str, Any],
) -> Turn | None:
    """The new turn, or None when another submission already owns the key
    (or the session vanished)."""
    row = await _ADMIT.fetchrow(
        conn,
        tenant=tenant,
        turn_id=turn_id,
        session_id=session_id,
        key=key,
        fingerprint=fingerprint,
        input=input,
        history=history,
        data=json.dumps(data),
    )
    if row is None:
        return None
    return turn_from_row(as_row(row))


async def turn_by_key(conn: AsyncConnection, *, session_id: uuid.UUID, key: str) -> Turn | None:
    row = (await conn.execute(_BY_KEY, {"session_id": session_id, "key": key})).first()
    return turn_from_row(row) if row is not None else None
