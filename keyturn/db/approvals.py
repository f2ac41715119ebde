"""Approval of tool calls: a turn that waits for a decision, and the decision.

Each write is one statement like those of :mod:`keyturn.db.leases`: the
session row first, then the turn's. Asking for approval is fenced by the
turn's epoch and status RUNNING, and it releases the lease in the same
statement: a WAITING turn has no owner and no lease. A turn whose cancel was
asked for does not start to wait: its runner stops it instead. A decision is fenced by
status WAITING and the epoch under which the approval was asked for, so of
any number of decisions racing for one call exactly one changes the turn
(the others find it QUEUED and write nothing), and a decision meant for an
earlier wait cannot answer a later one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from keyturn.db import keys
from keyturn.db.engine import Conn
from keyturn.db.failures import DRIVER_ERRORS, violated
from keyturn.db.leases import SESSION_OF_TURN
from keyturn.db.records import TurnRecord, turn_from
from keyturn.db.sql import Statement, append_event, columns, literal, literals
from keyturn.db.tables import Turn
from keyturn.domain import EventType, KeyKind, TurnStatus

WAITING = literal(TurnStatus.WAITING)
DECISIONS = (EventType.TOOL_APPROVED, EventType.TOOL_REJECTED)
ONE_DECISION_PER_KEY = "ux_events_decision_key"

_REQUEST = Statement(
    f"""
    WITH {SESSION_OF_TURN}, u AS (
        UPDATE turns SET status = {WAITING}, owner = NULL, lease_until = NULL
        FROM s
        WHERE turns.id = :turn_id AND turns.session_id = s.id
          AND turns.epoch = :epoch AND turns.status = {literal(TurnStatus.RUNNING)}
          AND turns.cancel_requested_at IS NULL
        RETURNING turns.id, turns.session_id
    ), {
        append_event(
            "u", type=literal(EventType.TOOL_APPROVAL_REQUESTED), data="CAST(:data AS jsonb)"
        )
    }
    SELECT seq FROM ev
    """
)

# The turn goes back to the queue (QUEUED) as the session's head; any
# process then claims it under a new epoch and resumes it from its record.
_DECIDE = Statement(
    f"""
    WITH o AS (
        SELECT t.session_id FROM turns t JOIN sessions x ON x.id = t.session_id
        WHERE t.id = :turn_id AND x.tenant = :tenant
    ), s AS (
        SELECT sessions.id FROM sessions WHERE sessions.id = (SELECT session_id FROM o)
        FOR UPDATE
    ), u AS (
        UPDATE turns SET status = {literal(TurnStatus.QUEUED)}
        FROM s
        WHERE turns.id = :turn_id AND turns.session_id = s.id
          AND turns.status = {WAITING} AND turns.epoch = :epoch
        RETURNING turns.id, turns.session_id
    ), {keys.take("u", KeyKind.DECISION, session="u.session_id", turn="u.id")}, {
        append_event("u", type="CAST(:type AS text)", data="CAST(:data AS jsonb)")
    }
    SELECT seq FROM ev
    """
)

# The turn, what already holds the key in its session (one namespace of keys
# per session, keyturn.db.keys) and, when a decision does, that decision,
# found through its unique index.
_LOOKUP = Statement(
    f"""
    SELECT {columns(Turn, alias="t")}, {keys.holder("t.session_id")},
           (SELECT jsonb_build_object('turnId', e.turn_id, 'type', e.type, 'data', e.data)
            FROM events e
            WHERE e.session_id = t.session_id AND e.type IN ({literals(DECISIONS)})
              AND e.data ->> 'idempotencyKey' = :key
            ORDER BY e.seq LIMIT 1) AS by_key
    FROM turns t JOIN sessions s ON s.id = t.session_id AND s.tenant = :tenant
    WHERE t.id = :turn_id
    """
)

# Waiting calls of one tenant, oldest request first, paged by the request
# event's id. Only the request of the turn's current epoch is still open.
_PENDING = Statement(
    f"""
    SELECT e.id AS event_id, e.data, e.created_at AS requested_at,
           {columns(Turn, alias="t", prefix="t_")}
    FROM turns t
    JOIN sessions s ON s.id = t.session_id AND s.tenant = :tenant
    JOIN events e ON e.turn_id = t.id
                 AND e.type = {literal(EventType.TOOL_APPROVAL_REQUESTED)}
                 AND e.data ->> 'epoch' = CAST(t.epoch AS text)
    WHERE t.status = {WAITING} AND e.id > :after
    ORDER BY e.id
    LIMIT :limit
    """
)

_TURN = Statement(f"SELECT {columns(Turn)} FROM turns WHERE id = :turn_id")


@dataclass(frozen=True, slots=True)
class KeyHolder:
    """What already holds a decision key in a session."""

    decision: dict[str, Any] | None  # {"turnId", "type", "data"} of a decision event
    turn_id: uuid.UUID | None  # a submitted turn's key
    decided_turn: uuid.UUID | None  # a resolution's, cancel's or pruned decision's key: its turn

    @property
    def held(self) -> bool:
        return (
            self.decision is not None or self.turn_id is not None or self.decided_turn is not None
        )


@dataclass(frozen=True, slots=True)
class PendingRow:
    event_id: int
    data: dict[str, Any]
    turn: TurnRecord


async def request(conn: Conn, *, turn_id: uuid.UUID, epoch: int, data: dict[str, Any]) -> bool:
    """Record ``tool.approval_requested`` and make the turn WAITING, its lease
    released; False when the epoch or status no longer matched, or the
    turn's cancel was asked for."""
    seq = await _REQUEST.fetchval(
        conn, turn_id=turn_id, epoch=epoch, data=orjson.dumps(data).decode()
    )
    return seq is not None


async def decide(
    conn: Conn,
    *,
    tenant: str,
    turn_id: uuid.UUID,
    epoch: int,
    key: str,
    type: EventType,
    data: dict[str, Any],
) -> bool:
    """Record the decision and put the turn back in the queue; False when
    the turn no longer waits under ``epoch`` (another decision came first)."""
    try:
        seq = await _DECIDE.fetchval(
            conn,
            tenant=tenant,
            turn_id=turn_id,
            epoch=epoch,
            key=key,
            type=type.value,
            data=orjson.dumps(data).decode(),
        )
    except DRIVER_ERRORS as error:
        # The key was taken meanwhile: the caller judges what took it.
        if violated(error) in (ONE_DECISION_PER_KEY, keys.PRIMARY_KEY):
            return False
        raise
    return seq is not None


async def lookup(
    conn: Conn, *, tenant: str, turn_id: uuid.UUID, key: str
) -> tuple[TurnRecord, KeyHolder] | None:
    row = await _LOOKUP.fetchrow(conn, tenant=tenant, turn_id=turn_id, key=key)
    if row is None:
        return None
    by_key = row["by_key"]
    holder = keys.Holder.of(row)
    return turn_from(row), KeyHolder(
        decision=orjson.loads(by_key) if isinstance(by_key, str) else by_key,
        turn_id=holder.turn_if(KeyKind.TURN),
        # A decision's key whose event retention blanked still holds the key
        # (its row in session_keys names the pruned turn): a conflict, not a
        # fresh decision that then loses on the key's primary key.
        decided_turn=holder.turn_if(KeyKind.RESOLUTION, KeyKind.CANCEL, KeyKind.DECISION),
    )


async def pending(conn: Conn, *, tenant: str, after: int, limit: int) -> list[PendingRow]:
    rows = await _PENDING.fetch(conn, tenant=tenant, after=after, limit=limit)
    return [PendingRow(r["event_id"], dict(r["data"]), turn_from(r, "t_")) for r in rows]


async def turn(conn: Conn, *, turn_id: uuid.UUID) -> TurnRecord | None:
    row = await _TURN.fetchrow(conn, turn_id=turn_id)
    return turn_from(row) if row is not None else None
