"""The admission writes: claim a key, insert the turn, append ``turn.started``.

Admission is one SQL statement in autocommit mode, so one transaction and one
round trip. The unique index on ``(session_id, idempotency_key)`` alone decides
which submission owns a key; a loser's statement returns no row and the caller
reads the winner with a separate statement.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from keyturn.db.engine import Conn
from keyturn.db.records import TurnRecord, turn_from
from keyturn.db.sql import Statement, append_event, columns, literal
from keyturn.db.tables import Turn
from keyturn.domain import EventType, History, TurnStatus

_LOOKUP = Statement(
    f"""
    SELECT s.default_history AS session_default_history, {columns(Turn, alias="t", prefix="t_")}
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
        SELECT :turn_id, s.id, :key, :fingerprint, :input, :history,
               {literal(TurnStatus.QUEUED)}, s.event_seq + 1
        FROM s
        ON CONFLICT (session_id, idempotency_key) DO NOTHING
        RETURNING {columns(Turn)}
    ), {
        append_event(
            "ins",
            type=literal(EventType.TURN_STARTED),
            data="CAST(:data AS jsonb) || jsonb_build_object('seq', ins.admit_seq)",
            next_seq="ins.admit_seq",
        )
    }
    SELECT ins.* FROM ins, ev
    """
)

_BY_KEY = Statement(
    f"SELECT {columns(Turn)} FROM turns WHERE session_id = :session_id AND idempotency_key = :key"
)


@dataclass(frozen=True, slots=True)
class AdmissionLookup:
    """What the record says before a write: does the session exist, and does
    the key already name a turn in it."""

    session_found: bool
    default_history: History | None
    existing: TurnRecord | None


async def lookup(conn: Conn, *, tenant: str, session_id: uuid.UUID, key: str) -> AdmissionLookup:
    row = await _LOOKUP.fetchrow(conn, tenant=tenant, session_id=session_id, key=key)
    if row is None:
        return AdmissionLookup(False, None, None)
    existing = turn_from(row, "t_") if row["t_id"] is not None else None
    return AdmissionLookup(True, History(row["session_default_history"]), existing)


async def insert_turn(
    conn: Conn,
    *,
    tenant: str,
    turn_id: uuid.UUID,
    session_id: uuid.UUID,
    key: str,
    fingerprint: str,
    input: str,
    history: History,
    data: dict[str, Any],
) -> TurnRecord | None:
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
        data=orjson.dumps(data).decode(),
    )
    return turn_from(row) if row is not None else None


async def turn_by_key(conn: Conn, *, session_id: uuid.UUID, key: str) -> TurnRecord | None:
    row = await _BY_KEY.fetchrow(conn, session_id=session_id, key=key)
    return turn_from(row) if row is not None else None
