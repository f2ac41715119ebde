"""The cancel writes: a cancel asked for a turn, under its key or a submission's.

A cancel is one transaction: the session row is locked first (the order every
writer of a turn keeps, see :mod:`keyturn.db.leases`), then the turn and the
key are read as they stand *after* the lock, and the write follows. Every
other writer of the turn's status (claim, finish, interrupt, release,
admission) takes the same session lock, so what the read saw still holds
when the write lands: a cancel never meets a turn halfway through ending.

A turn holds at most one cancel, in its ``cancel_*`` columns. One not yet
running (QUEUED or WAITING) ends at once, CANCELLED with ``turn.cancelled``;
a RUNNING one gets ``turn.cancel_requested``, and its process ends it at a
safe point (:func:`keyturn.db.leases.finish_many`, fenced by the epoch).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from keyturn.db import keys
from keyturn.db.engine import Conn
from keyturn.db.records import TurnRecord, turn_from
from keyturn.db.sql import Statement, append_event, columns, literal, literals
from keyturn.db.tables import Turn
from keyturn.domain import ACTIVE_STATUSES, EventType, KeyKind, TurnStatus

_LOCK = Statement(
    """
    SELECT s.id FROM sessions s JOIN turns t ON t.session_id = s.id
    WHERE t.id = :turn_id AND s.tenant = :tenant
    FOR UPDATE OF s
    """
)

# The turn, and what already holds the key in its session (one namespace of
# keys per session, keyturn.db.keys), read after the session's lock.
_LOOKUP = Statement(
    f"""
    SELECT {columns(Turn, alias="t", prefix="t_")}, {keys.holder("t.session_id")}
    FROM turns t WHERE t.id = :turn_id
    """
)

# A multitask INTERRUPT's cancel (:key NULL) takes no key.
_TAKE_KEY = keys.take(
    "u", KeyKind.CANCEL, session="u.session_id", turn="u.id", where="u.cancel_key IS NOT NULL"
)

_CANCEL_SET = """
    cancel_requested_at = now(), cancel_reason = :reason, cancel_key = :key,
    cancel_fingerprint = :fingerprint"""

# Not running yet: it ends here. Its output (a WAITING turn may have streamed
# some) stays as recorded.
_CANCEL_NOW = Statement(
    f"""
    WITH u AS (
        UPDATE turns SET status = {literal(TurnStatus.CANCELLED)}, completed_at = now(),
               lease_until = NULL, {_CANCEL_SET}
        WHERE id = :turn_id AND cancel_requested_at IS NULL
          AND status IN ({literals((TurnStatus.QUEUED, TurnStatus.WAITING))})
        RETURNING turns.*
    ), {_TAKE_KEY}, {
        append_event(
            "u",
            type=literal(EventType.TURN_CANCELLED),
            data='''jsonb_build_object(
                   'status', u.status, 'reason', u.cancel_reason,
                   'idempotencyKey', u.cancel_key, 'epoch', u.epoch,
                   'output', u.output, 'was', CAST(:was AS text))''',
        )
    }
    SELECT {columns(Turn, alias="u")} FROM u
    """
)

# Running: the request is recorded; the process running it stops it.
_REQUEST = Statement(
    f"""
    WITH u AS (
        UPDATE turns SET {_CANCEL_SET}
        WHERE id = :turn_id AND cancel_requested_at IS NULL
          AND status = {literal(TurnStatus.RUNNING)}
        RETURNING turns.*
    ), {_TAKE_KEY}, {
        append_event(
            "u",
            type=literal(EventType.TURN_CANCEL_REQUESTED),
            data='''jsonb_build_object(
                   'reason', u.cancel_reason, 'idempotencyKey', u.cancel_key,
                   'owner', u.owner, 'epoch', u.epoch)''',
        )
    }
    SELECT {columns(Turn, alias="u")} FROM u
    """
)

# A turn asked to stop while it ran that went on to wait for a decision
# (the request and its wait crossed): nothing runs it now, so it ends here,
# under the cancel it already holds.
_END_WAITING = Statement(
    f"""
    WITH u AS (
        UPDATE turns SET status = {literal(TurnStatus.CANCELLED)}, completed_at = now(),
               lease_until = NULL
        WHERE id = :turn_id AND cancel_requested_at IS NOT NULL
          AND status = {literal(TurnStatus.WAITING)}
        RETURNING turns.*
    ), {
        append_event(
            "u",
            type=literal(EventType.TURN_CANCELLED),
            data=f'''jsonb_build_object(
                   'status', u.status, 'reason', u.cancel_reason,
                   'idempotencyKey', u.cancel_key, 'epoch', u.epoch,
                   'output', u.output, 'was', {literal(TurnStatus.WAITING)})''',
        )
    }
    SELECT {columns(Turn, alias="u")} FROM u
    """
)

_ACTIVE = Statement(
    f"""
    SELECT id FROM turns
    WHERE session_id = :session_id AND status IN ({literals(ACTIVE_STATUSES)})
      AND id IS DISTINCT FROM CAST(:except_id AS uuid) AND cancel_requested_at IS NULL
    ORDER BY admit_seq
    """
)

_REQUESTED = Statement(
    "SELECT cancel_reason, cancel_key FROM turns"
    " WHERE id = :turn_id AND cancel_requested_at IS NOT NULL"
)
_REQUESTED_OF = Statement(
    "SELECT id, cancel_reason, cancel_key FROM turns"
    " WHERE id = ANY(CAST(:turn_ids AS uuid[])) AND cancel_requested_at IS NOT NULL"
)


@dataclass(frozen=True, slots=True)
class Requested:
    """A cancel asked for a turn: why (None: no reason given), and its key
    (None: a multitask INTERRUPT's)."""

    reason: str | None
    key: str | None


@dataclass(frozen=True, slots=True)
class CancelLookup:
    turn: TurnRecord  # as it stands under the session lock
    cancelled_turn_id: uuid.UUID | None  # the turn whose cancel already holds the key
    key_turn_id: uuid.UUID | None  # a turn submitted under the key
    resolved_turn_id: uuid.UUID | None  # a turn a resolution under the key decided
    decided_turn_id: uuid.UUID | None  # a turn whose tool call a decision under the key decided


@dataclass(frozen=True, slots=True)
class CancelWrite:
    lookup: CancelLookup | None  # None: no such turn for this tenant
    written: TurnRecord | None  # the turn after the cancel; None when nothing was written


async def cancel(
    conn: Conn,
    *,
    tenant: str,
    turn_id: uuid.UUID,
    key: str | None,
    fingerprint: str | None,
    reason: str | None,
) -> CancelWrite:
    """Cancel ``turn_id`` unless the key is already taken in its session, the
    turn already has a cancel or it has ended; the lookup says which. A
    ``key`` of None (a multitask INTERRUPT) takes no key."""
    async with conn.driver.transaction():
        return await _cancel(
            conn, tenant=tenant, turn_id=turn_id, key=key, fingerprint=fingerprint, reason=reason
        )


async def _cancel(
    conn: Conn,
    *,
    tenant: str,
    turn_id: uuid.UUID,
    key: str | None,
    fingerprint: str | None,
    reason: str | None,
) -> CancelWrite:
    if await _LOCK.fetchrow(conn, turn_id=turn_id, tenant=tenant) is None:
        return CancelWrite(None, None)
    row = await _LOOKUP.fetchrow(conn, turn_id=turn_id, key=key)
    assert row is not None  # the session lock keeps the turn
    holder = keys.Holder.of(row)
    found = CancelLookup(
        turn=turn_from(row, "t_"),
        cancelled_turn_id=holder.turn_if(KeyKind.CANCEL),
        key_turn_id=holder.turn_if(KeyKind.TURN),
        resolved_turn_id=holder.turn_if(KeyKind.RESOLUTION),
        decided_turn_id=holder.turn_if(KeyKind.DECISION),
    )
    taken = (
        found.cancelled_turn_id,
        found.key_turn_id,
        found.resolved_turn_id,
        found.decided_turn_id,
    )
    turn = found.turn
    if turn.status is TurnStatus.WAITING and turn.cancel_requested_at is not None:
        ended = await _END_WAITING.fetchrow(conn, turn_id=turn_id)
        if ended is not None:
            found = replace(found, turn=turn_from(ended))
        return CancelWrite(found, None)
    if any(t is not None for t in taken) or turn.cancel_requested_at is not None:
        return CancelWrite(found, None)
    params = {"turn_id": turn_id, "key": key, "fingerprint": fingerprint, "reason": reason}
    if turn.status is TurnStatus.RUNNING:
        written = await _REQUEST.fetchrow(conn, **params)
    elif turn.status in (TurnStatus.QUEUED, TurnStatus.WAITING):
        written = await _CANCEL_NOW.fetchrow(conn, was=turn.status, **params)
    else:
        return CancelWrite(found, None)
    return CancelWrite(found, turn_from(written) if written is not None else None)


async def cancel_active(
    conn: Conn, *, tenant: str, session_id: uuid.UUID, except_id: uuid.UUID | None, reason: str
) -> list[TurnRecord]:
    """Cancel every queued, waiting or running turn of the session but
    ``except_id`` (multitask INTERRUPT; None, a deletion: every one), in the
    caller's transaction, which already holds the session row. The turns it
    cancelled or asked to stop; a turn that already has a cancel is left as
    it is, so asking again writes nothing."""
    done: list[TurnRecord] = []
    for row in await _ACTIVE.fetch(conn, session_id=session_id, except_id=except_id):
        write = await _cancel(
            conn, tenant=tenant, turn_id=row["id"], key=None, fingerprint=None, reason=reason
        )
        if write.written is not None:
            done.append(write.written)
    return done


async def requested(conn: Conn, *, turn_id: uuid.UUID) -> Requested | None:
    """The turn's cancel, once one was asked for; else None."""
    row = await _REQUESTED.fetchrow(conn, turn_id=turn_id)
    return Requested(row["cancel_reason"], row["cancel_key"]) if row is not None else None


async def requested_of(conn: Conn, *, turn_ids: list[uuid.UUID]) -> dict[uuid.UUID, Requested]:
    """The cancels asked for among ``turn_ids``, by turn, in one read."""
    rows = await _REQUESTED_OF.fetch(conn, turn_ids=turn_ids)
    return {r["id"]: Requested(r["cancel_reason"], r["cancel_key"]) for r in rows}
