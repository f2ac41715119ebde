"""Explicit resolutions of interrupted turns: RETRY (a new turn) or ABANDON.

Like admission: one statement claims the key (its row in ``session_keys``,
:mod:`keyturn.db.keys`, and one resolution per turn), inserts the
retry turn, bumps the session's counter and appends the events; a statement
that loses a race writes nothing and the caller reads the winner.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from keyturn.db import keys
from keyturn.db.engine import Conn
from keyturn.db.failures import DRIVER_ERRORS, violated
from keyturn.db.records import ResolutionRecord, TurnRecord, resolution_from, turn_from
from keyturn.db.sql import Statement, columns, literal
from keyturn.db.tables import Resolution, Turn
from keyturn.domain import EventType, KeyKind, ResolutionAction, TurnStatus

RETRY = literal(ResolutionAction.RETRY)

_LOOKUP = Statement(
    f"""
    SELECT {columns(Turn, alias="t", prefix="t_")},
           {columns(Resolution, alias="r", prefix="r_")},
           {columns(Resolution, alias="x", prefix="x_")}, {keys.holder("t.session_id")}
    FROM turns t
    JOIN sessions s ON s.id = t.session_id AND s.tenant = :tenant
    LEFT JOIN resolutions r ON r.session_id = t.session_id AND r.idempotency_key = :key
    LEFT JOIN resolutions x ON x.turn_id = t.id
    WHERE t.id = :turn_id
    """
)

# The one statement that appends two events (turn.retried, then the retry's
# turn.started), so it bumps the counter by two itself rather than through
# keyturn.db.sql.append_event.
_RESOLVE = Statement(
    f"""
    WITH o AS (
        SELECT t.id, t.session_id, t.input, t.history
        FROM turns t JOIN sessions s ON s.id = t.session_id
        WHERE t.id = :turn_id AND s.tenant = :tenant
          AND t.status = {literal(TurnStatus.INTERRUPTED)}
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
        ON CONFLICT DO NOTHING
        RETURNING {columns(Resolution)}
    ), {keys.take("res", KeyKind.RESOLUTION, session="res.session_id", turn="res.turn_id")},
    ins AS (
        INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history,
                           status, admit_seq, retry_of)
        SELECT res.new_turn_id, o.session_id, :key, :fingerprint, o.input, o.history,
               {literal(TurnStatus.QUEUED)}, s.event_seq + 2, o.id
        FROM res, o, s
        WHERE res.action = {RETRY}
        RETURNING {columns(Turn)}
    ), bump AS (
        UPDATE sessions
        SET event_seq = sessions.event_seq + CASE WHEN res.action = {RETRY} THEN 2 ELSE 1 END
        FROM res WHERE sessions.id = res.session_id
        RETURNING sessions.event_seq
    ), ev AS (
        INSERT INTO events (session_id, turn_id, seq, type, data)
        SELECT res.session_id, res.turn_id, s.event_seq + 1,
               CASE WHEN res.action = {RETRY} THEN {literal(EventType.TURN_RETRIED)}
                    ELSE {literal(EventType.TURN_ABANDONED)} END,
               jsonb_build_object('idempotencyKey', res.idempotency_key, 'action', res.action,
                                  'force', res.force, 'newTurnId', res.new_turn_id)
        FROM res, s, bump
        UNION ALL
        SELECT ins.session_id, ins.id, ins.admit_seq, {literal(EventType.TURN_STARTED)},
               jsonb_build_object('idempotencyKey', ins.idempotency_key, 'history', ins.history,
                                  'seq', ins.admit_seq, 'retryOf', ins.retry_of)
        FROM ins, bump
        RETURNING seq
    )
    SELECT {columns(Resolution, alias="res", prefix="r_")}, (SELECT count(*) FROM ev) AS appended
    FROM res
    """
)

_TURN = Statement(f"SELECT {columns(Turn)} FROM turns WHERE id = :id")


@dataclass(frozen=True, slots=True)
class ResolutionLookup:
    turn: TurnRecord
    by_key: ResolutionRecord | None  # the resolution the key already names in the turn's session
    of_turn: ResolutionRecord | None  # the turn's resolution, under whatever key
    # The turn a submission, a cancel or a decision under the key concerns.
    key_turn_id: uuid.UUID | None


async def lookup(
    conn: Conn, *, tenant: str, turn_id: uuid.UUID, key: str
) -> ResolutionLookup | None:
    row = await _LOOKUP.fetchrow(conn, tenant=tenant, turn_id=turn_id, key=key)
    if row is None:
        return None
    holder = keys.Holder.of(row)
    return ResolutionLookup(
        turn=turn_from(row, "t_"),
        by_key=resolution_from(row, "r_"),
        of_turn=resolution_from(row, "x_"),
        key_turn_id=holder.turn_if(KeyKind.TURN, KeyKind.CANCEL, KeyKind.DECISION),
    )


async def resolve(
    conn: Conn,
    *,
    tenant: str,
    turn_id: uuid.UUID,
    key: str,
    fingerprint: str,
    action: ResolutionAction,
    force: bool,
    new_turn_id: uuid.UUID | None,
) -> ResolutionRecord | None:
    """The new resolution, or None when the statement wrote nothing (the turn
    is not INTERRUPTED, or the key or the turn was already taken)."""
    try:
        row = await _RESOLVE.fetchrow(
            conn,
            tenant=tenant,
            turn_id=turn_id,
            resolution_id=uuid.uuid4(),
            key=key,
            fingerprint=fingerprint,
            action=action,
            force=force,
            new_turn_id=new_turn_id,
        )
    except DRIVER_ERRORS as error:
        # Another request took the key between our check and insert
        # (keyturn.db.keys), or a turn took it.
        if violated(error) is not None:
            return None
        raise
    return resolution_from(row, "r_") if row is not None else None


async def turn(conn: Conn, *, turn_id: uuid.UUID) -> TurnRecord | None:
    row = await _TURN.fetchrow(conn, id=turn_id)
    return turn_from(row) if row is not None else None
