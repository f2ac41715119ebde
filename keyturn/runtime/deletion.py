"""Deleting a session, idempotent under its key: the same key for the same
session replays the answer (nothing written), for another session it
conflicts.

A session with a RUNNING turn is not deleted under it: the deletion first
cancels the session's active turns as ``cancelTurn`` would (``turn.
cancel_requested`` for the running one, CANCELLED at once for those queued
or waiting for a decision), with the reason :data:`REASON` and no key of
their own, then waits for the running turn to stop at its safe point and
deletes everything in one transaction. A tool call in flight is never cut,
so the deletion waits for its result too, at most ``wait_s``; past it the
answer is BUSY with the cancel recorded and nothing else written, and the
same key sent again carries on: a turn that already has its cancel is not
asked twice.

Internal cancels take no key: the session's namespace (:mod:`keyturn.db.
keys`) is its users', and a key derived from the deletion's could still
meet one of theirs. The deletion's own key lives apart, in the tenant's
``session_deletions``, and is taken only by the transaction that deletes.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from keyturn.db import deletion as db
from keyturn.db.engine import Engine, connect
from keyturn.db.records import TurnRecord
from keyturn.runtime.validation import check_key, parse_uuid

log = logging.getLogger(__name__)

# Recorded with the cancels a deletion makes (turn.cancelled, turn.cancel_requested).
REASON = "the session is being deleted"

# While it waits, a deletion reads whether the running turn has stopped,
# first soon (a turn at a safe point stops within milliseconds), then less
# often: one indexed read, on no lock, a few times a second at most.
_FIRST_PAUSE_S = 0.02
_LONGEST_PAUSE_S = 0.25


@dataclass(frozen=True, slots=True)
class DeletionRequest:
    session_id: uuid.UUID
    idempotency_key: str

    @classmethod
    def parse(cls, *, session_id: str, idempotency_key: str) -> DeletionRequest:
        sid = parse_uuid(session_id, field="sessionId")
        check_key(idempotency_key)
        return cls(sid, idempotency_key)


class DeletionOutcome(Enum):
    DELETED = "deleted"
    REPLAYED = "replayed"
    CONFLICT = "conflict"  # the key already deleted another session
    SESSION_NOT_FOUND = "session_not_found"
    # A turn still runs after wait_s: its cancel is recorded, nothing else
    # was written; the same key again carries on.
    BUSY = "busy"


@dataclass(frozen=True, slots=True)
class DeletionResult:
    outcome: DeletionOutcome
    conflicting_session_id: uuid.UUID | None = None
    running_turn_id: uuid.UUID | None = None


def _judge(deleted: uuid.UUID, request: DeletionRequest) -> DeletionResult:
    if deleted == request.session_id:
        return DeletionResult(DeletionOutcome.REPLAYED)
    return DeletionResult(DeletionOutcome.CONFLICT, conflicting_session_id=deleted)


async def delete_session(
    *,
    engine: Engine,
    request: DeletionRequest,
    tenant: str,
    wait_s: float,
    on_cancelled: Callable[[list[TurnRecord]], None],
) -> DeletionResult:
    """Delete the session, cancelling its turns first while one runs (see
    the module). ``on_cancelled`` hears of every cancel this call recorded,
    as a ``cancelTurn`` would tell the processes running them."""
    key = request.idempotency_key
    sid = request.session_id
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    async with connect(engine) as conn:
        earlier = await db.deleted_under(conn, tenant=tenant, key=key)
    if earlier is not None:
        return _judge(earlier, request)
    while True:
        async with connect(engine) as conn:
            removal = await db.delete_session(
                conn, tenant=tenant, session_id=sid, key=key, reason=REASON
            )
        if removal.outcome is db.Removed.REMOVED:
            log.info(
                "session deleted",
                extra={"session_id": str(sid), "idempotency_key": key}
                | {f"{table}_deleted": n for table, n in removal.rows.items()},
            )
            return DeletionResult(DeletionOutcome.DELETED)
        if removal.outcome is not db.Removed.RUNNING:
            break
        if removal.cancelled:
            on_cancelled(removal.cancelled)
            log.info(
                "session deletion: %d turn(s) cancelled first",
                len(removal.cancelled),
                extra={"session_id": str(sid), "idempotency_key": key},
            )
        if not await _stopped(engine, sid, deadline):
            log.info(
                "session deletion: turn %s still running; answered busy",
                removal.running_turn_id,
                extra={"session_id": str(sid), "idempotency_key": key},
            )
            return DeletionResult(DeletionOutcome.BUSY, running_turn_id=removal.running_turn_id)
    # Another deletion took the key, or deleted the session, while this one
    # waited: under this key that is a replay or a conflict; otherwise the
    # session is simply not there.
    async with connect(engine) as conn:
        earlier = await db.deleted_under(conn, tenant=tenant, key=key)
    if earlier is not None:
        return _judge(earlier, request)
    return DeletionResult(DeletionOutcome.SESSION_NOT_FOUND)


async def _stopped(engine: Engine, session_id: uuid.UUID, deadline: float) -> bool:
    """Wait until the session has no running turn that was asked to stop
    (none runs, or one runs without a cancel: the next attempt asks it);
    False once ``deadline`` passes first. No connection is held between reads."""
    loop = asyncio.get_running_loop()
    pause = _FIRST_PAUSE_S
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        await asyncio.sleep(min(pause, remaining))
        pause = min(pause * 2, _LONGEST_PAUSE_S)
        async with connect(engine) as conn:
            if not await db.only_stopping(conn, session_id=session_id):
                return True
