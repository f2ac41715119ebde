"""Explicit resolutions of interrupted turns: RETRY (a new turn) or ABANDON.

Like admission: one statement claims the key (unique ``(session_id,
idempotency_key)`` on resolutions, and one resolution per turn), inserts the
retry turn, bumps the session's counter and appends the events; a statement
that loses a race writes nothing and the caller reads the winner.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from keyturn.db.engine import sqlstate_of
from keyturn.db.rows import TURN_COLUMNS, turn_from_row
from keyturn.db.tables import Resolution, Turn

RESOLUTION_COLUMNS = (
    "id, session_id, turn_id, idempotency_key, fingerprint, action, force, new_turn_id, created_at"
)


def _prefixed(alias: str, columns: str, prefix: str) -> str:
    return ", ".join(f"{alias}.{c.strip()} AS {prefix}{c.strip()}" for c in columns.split(","))


_LOOKUP = text(
    f"""
    SELECT {_prefixed("t", TURN_COLUMNS, "t_")},
           {_prefixed("r", RESOLUTION_COLUMNS, "r_")},
           {_prefixed("x", RESOLUTION_COLUMNS, "x_")},
           k.id AS key_turn_id
    FROM turns t
    JOIN sessions s ON s.id = t.session_id AND s.tenant = :tenant
    LEFT JOIN resolutions r ON r.session_id = t.session_id AND r.idempotency_key = :key
    LEFT JOIN resolutions x ON x.turn_id = t.id
    LEFT JOIN turns k ON k.session_id = t.session_id AND k.idempotency_key = :key
    WHERE t.id = :turn_id
    """
)

_RESOLVE = text(
    f"""
    WITH o AS (
        SELECT t.id, t.session_id, t.input, t.history
        FROM turns t JOIN sessions s ON s.id = t.session_id
        WHERE t.id = :turn_id AND s.tenant = :tenant AND t.status = 'INTERRUPTED'
    ), s AS (
        SELECT sessions.id, sessions.event_seq FROM sessions
        WHERE sessions.id = (SELECT session_id FROM o)
        FOR UPDATE
    ), res AS (
        INSERT INTO resolutions (id, session_id, turn_id, idempotency_key, fingerprint, action,
                                 force, new_turn_id)
        SELECT :resolution_id, o.session_id, o.id, :key, :fingerprint, :action, :force,
               CAST(:new_turn_id AS uuid)
        FROM o, s
        WHERE NOT EXISTS (SELECT 1 FROM turns k
                          WHERE k.session_id = o.session_id AND k.idempotency_key = :key)
        ON CONFLICT DO NOTHING
        RETURNING {RESOLUTION_COLUMNS}
    ), ins AS (
        INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history,
                           status, admit_seq, retry_of)
        SELECT res.new_turn_id, o.session_id, :key, :fingerprint, o.input, o.history,
               'QUEUED', s.event_seq + 2, o.id
        FROM res, o, s
        WHERE res.action = 'RETRY'
        RETURNING {TURN_COLUMNS}
    ), bump AS (
        UPDATE sessions
        SET event_seq = sessions.event_seq + CASE WHEN res.action = 'RETRY' THEN 2 ELSE 1 END
        FROM res WHERE sessions.id = res.session_id
        RETURNING sessions.event_seq
    ), ev AS (
        INSERT INTO events (session_id, turn_id, seq, type, data)
        SELECT res.session_id, res.turn_id, s.event_seq + 1,
               CASE WHEN res.action = 'RETRY' THEN 'turn.retried' ELSE 'turn.abandoned' END,
               jsonb_build_object('idempotencyKey', res.idempotency_key, 'action', res.action,
                                  'force', res.force, 'newTurnId', res.new_turn_id)
        FROM res, s, bump
        UNION ALL
        SELECT ins.session_id, ins.id, ins.admit_seq, 'turn.started',
               jsonb_build_object('idempotencyKey', ins.idempotency_key, 'history', ins.history,
                                  'seq', ins.admit_seq, 'retryOf', ins.retry_of)
        FROM ins, bump
        RETURNING seq
    )
    SELECT {_prefixed("res", RESOLUTION_COLUMNS, "r_")},
           (SELECT count(*) FROM ev) AS appended
    FROM res
    """
)

_TURN = text(f"SELECT {TURN_COLUMNS} FROM turns WHERE id = :id")


def _resolution(row: Row[Any], prefix: str) -> Resolution | None:
    values = {c.strip(): getattr(row, prefix + c.strip()) for c in RESOLUTION_COLUMNS.split(",")}
    if values["id"] is None:
        return None
    return Resolution(**values)


@dataclass(frozen=True, slots=True)
class ResolutionLookup:
    turn: Turn
    by_key: Resolution | None  # the resolution the key already names in the turn's session
    of_turn: Resolution | None  # the turn's resolution, under whatever key
    key_turn_id: uuid.UUID | None  # a turn that already holds the key in the session


async def lookup(
    conn: AsyncConnection, *, tenant: str, turn_id: uuid.UUID, key: str
) -> ResolutionLookup | None:
    row = (await conn.execute(_LOOKUP, {"tenant": tenant, "turn_id": turn_id, "key": key})).first()
    if row is None:
        return None
    return ResolutionLookup(
        turn=turn_from_row(row, "t_"),
        by_key=_resolution(row, "r_"),
        of_turn=_resolution(row, "x_"),
        key_turn_id=row.key_turn_id,
    )


async def resolve(
    conn: AsyncConnection,
    *,
    tenant: str,
    turn_id: uuid.UUID,
    key: str,
    fingerprint: str,
    action: str,
    force: bool,
    new_turn_id: uuid.UUID | None,
) -> Resolution | None:
    """The new resolution, or None when the statement wrote nothing (the turn
    is not INTERRUPTED, or the key or the turn was already taken)."""
    try:
        row = (
            await conn.execute(
                _RESOLVE,
                {
                    "tenant": tenant,
                    "turn_id": turn_id,
                    "resolution_id": uuid.uuid4(),
                    "key": key,
                    "fingerprint": fingerprint,
                    "action": action,
                    "force": force,
                    "new_turn_id": new_turn_id,
                },
            )
        ).first()
    except sa_exc.IntegrityError as error:
        # A submission took the key for a turn between our check and insert.
        if sqlstate_of(error) == "23505":
            return None
        raise
    return _resolution(row, "r_") if row is not None else None


async def turn(conn: AsyncConnection, *, turn_id: uuid.UUID) -> Turn | None:
    row = (await conn.execute(_TURN, {"id": turn_id})).first()
    return turn_from_row(row) if row is not None else None
