"""The tool ledger: what a running turn's tool calls did, as events.

Each write is one statement in the style of :mod:`keyturn.db.work`: it checks
the turn, bumps the session's counter and appends the event, so seq stays
gapless and commit-ordered. Writes for a running turn are fenced by its epoch
and status RUNNING (the turn row is share-locked, so a concurrent interruption
either comes first and the write is refused, or waits for it). A
reconciliation is written only for an INTERRUPTED turn. A unique index allows
one intent, one result and one reconciliation per call, so a write retried
after a lost connection cannot append twice.
"""

from __future__ import annotations

import json
import uuid
from enum import Enum
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from keyturn.db.engine import sqlstate_of

_APPEND_RUNNING = text(
    """
    WITH t AS (
        SELECT id, session_id FROM turns
        WHERE id = :turn_id AND epoch = :epoch AND status = 'RUNNING'
        FOR SHARE
    ), bump AS (
        UPDATE sessions SET event_seq = sessions.event_seq + 1
        FROM t WHERE sessions.id = t.session_id
        RETURNING sessions.event_seq
    )
    INSERT INTO events (session_id, turn_id, seq, type, data)
    SELECT t.session_id, t.id, bump.event_seq, :type, CAST(:data AS jsonb)
    FROM t, bump
    RETURNING seq
    """
)

_APPEND_RECONCILED = text(
    """
    WITH t AS (
        SELECT id, session_id FROM turns
        WHERE id = :turn_id AND status = 'INTERRUPTED'
        FOR SHARE
    ), bump AS (
        UPDATE sessions SET event_seq = sessions.event_seq + 1
        FROM t WHERE sessions.id = t.session_id
        RETURNING sessions.event_seq
    )
    INSERT INTO events (session_id, turn_id, seq, type, data)
    SELECT t.session_id, t.id, bump.event_seq, 'tool.reconciled', CAST(:data AS jsonb)
    FROM t, bump
    RETURNING seq
    """
)

# Interrupted turns with an idempotent call whose outcome nobody settled yet
# (the process that interrupted them stopped before it could).
_UNSETTLED = text(
    """
    SELECT DISTINCT i.turn_id FROM events i JOIN turns t ON t.id = i.turn_id
    WHERE t.status = 'INTERRUPTED' AND i.type = 'tool.intent'
      AND i.data ->> 'kind' = 'IDEMPOTENT'
      AND NOT EXISTS (SELECT 1 FROM events r
                      WHERE r.turn_id = i.turn_id
                        AND r.type IN ('tool.result', 'tool.reconciled')
                        AND r.data ->> 'index' = i.data ->> 'index')
    LIMIT :limit
    """
)


class Appended(Enum):
    APPENDED = "appended"
    DUPLICATE = "duplicate"  # this call already has that event
    REFUSED = "refused"  # the epoch or status no longer matched


def _is_unique_violation(error: BaseException) -> bool:
    return isinstance(error, sa_exc.IntegrityError) and sqlstate_of(error) == "23505"


async def append(
    conn: AsyncConnection, *, turn_id: uuid.UUID, epoch: int, type: str, data: dict[str, Any]
) -> Appended:
    """Append a ``tool.*`` event for a turn this caller runs under ``epoch``."""
    try:
        row = (
            await conn.execute(
                _APPEND_RUNNING,
                {"turn_id": turn_id, "epoch": epoch, "type": type, "data": json.dumps(data)},
            )
        ).first()
    except sa_exc.IntegrityError as error:
        if _is_unique_violation(error):
            return Appended.DUPLICATE
        raise
    return Appended.APPENDED if row is not None else Appended.REFUSED


async def append_reconciled(
    conn: AsyncConnection, *, turn_id: uuid.UUID, data: dict[str, Any]
) -> Appended:
    """Append ``tool.reconciled`` for a call of an INTERRUPTED turn."""
    try:
        row = (
            await conn.execute(_APPEND_RECONCILED, {"turn_id": turn_id, "data": json.dumps(data)})
        ).first()
    except sa_exc.IntegrityError as error:
        if _is_unique_violation(error):
            return Appended.DUPLICATE
        raise
    return Appended.APPENDED if row is not None else Appended.REFUSED


async def unsettled_turns(conn: AsyncConnection, *, limit: int = 100) -> list[uuid.UUID]:
    rows = (await conn.execute(_UNSETTLED, {"limit": limit})).all()
    return [r.turn_id for r in rows]
