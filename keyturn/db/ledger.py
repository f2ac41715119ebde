"""The tool ledger: what a running turn's tool calls did, as events.

Each write is one statement like those of :mod:`keyturn.db.leases`: it checks
the turn, bumps the session's counter and appends the event, so seq stays
gapless and commit-ordered. Writes for a running turn are fenced by its epoch
and status RUNNING (the turn row is share-locked, so a concurrent interruption
either comes first and the write is refused, or waits for it). A
reconciliation is written only for an INTERRUPTED turn. A unique index allows
one intent, one result and one reconciliation per call, so a write retried
after a lost connection cannot append twice.
"""

from __future__ import annotations

import uuid
from enum import Enum
from typing import Any

import orjson

from keyturn.db.engine import Conn
from keyturn.db.failures import DRIVER_ERRORS, violated
from keyturn.db.sql import Statement, append_event, literal
from keyturn.domain import EventType, ToolKind, TurnStatus

_APPEND_RUNNING = Statement(
    f"""
    WITH t AS (
        SELECT id, session_id FROM turns
        WHERE id = :turn_id AND epoch = :epoch AND status = {literal(TurnStatus.RUNNING)}
        FOR SHARE
    ), {append_event("t", type=":type", data="CAST(:data AS jsonb)")}
    SELECT seq FROM ev
    """
)

_APPEND_RECONCILED = Statement(
    f"""
    WITH t AS (
        SELECT id, session_id FROM turns
        WHERE id = :turn_id AND status = {literal(TurnStatus.INTERRUPTED)}
        FOR SHARE
    ), {append_event("t", type=literal(EventType.TOOL_RECONCILED), data="CAST(:data AS jsonb)")}
    SELECT seq FROM ev
    """
)

# Interrupted turns with an idempotent call whose outcome nobody settled yet
# (the process that interrupted them stopped before it could): an intent
# without a result, or with a result that says the outcome is unknown (the
# tool did not answer the call, nor the question asked then). Only those:
# a turn that ended otherwise is never retried, and keeps what it recorded.
_UNSETTLED = Statement(
    f"""
    SELECT DISTINCT i.turn_id FROM events i JOIN turns t ON t.id = i.turn_id
    WHERE t.status = {literal(TurnStatus.INTERRUPTED)}
      AND i.type = {literal(EventType.TOOL_INTENT)}
      AND i.data ->> 'kind' = {literal(ToolKind.IDEMPOTENT)}
      AND NOT EXISTS (SELECT 1 FROM events r
                      WHERE r.turn_id = i.turn_id
                        AND r.data ->> 'index' = i.data ->> 'index'
                        AND (r.type = {literal(EventType.TOOL_RECONCILED)}
                             OR (r.type = {literal(EventType.TOOL_RESULT)}
                                 AND (r.data ->> 'outcomeUnknown') IS DISTINCT FROM 'true')))
    LIMIT :limit
    """
)

ONE_ENTRY_PER_CALL = "ux_events_tool_call"


class Appended(Enum):
    APPENDED = "appended"
    DUPLICATE = "duplicate"  # this call already has that event
    REFUSED = "refused"  # the epoch or status no longer matched


async def _append(statement: Statement, conn: Conn, **params: Any) -> Appended:
    try:
        seq = await statement.fetchval(conn, **params)
    except DRIVER_ERRORS as error:
        if violated(error) == ONE_ENTRY_PER_CALL:
            return Appended.DUPLICATE
        raise
    return Appended.APPENDED if seq is not None else Appended.REFUSED


async def append(
    conn: Conn, *, turn_id: uuid.UUID, epoch: int, type: EventType, data: dict[str, Any]
) -> Appended:
    """Append a ``tool.*`` event for a turn this caller runs under ``epoch``."""
    return await _append(
        _APPEND_RUNNING,
        conn,
        turn_id=turn_id,
        epoch=epoch,
        type=type,
        data=orjson.dumps(data).decode(),
    )


async def append_reconciled(conn: Conn, *, turn_id: uuid.UUID, data: dict[str, Any]) -> Appended:
    """Append ``tool.reconciled`` for a call of an INTERRUPTED turn."""
    return await _append(
        _APPEND_RECONCILED, conn, turn_id=turn_id, data=orjson.dumps(data).decode()
    )


async def unsettled_turns(conn: Conn, *, limit: int = 100) -> list[uuid.UUID]:
    return [r["turn_id"] for r in await _UNSETTLED.fetch(conn, limit=limit)]
