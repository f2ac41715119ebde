"""Deleting a session, idempotent under its key: the same key for the same
session replays the answer (nothing written), for another session it
conflicts. A session with a RUNNING turn is refused; QUEUED turns, which
never ran, go with it."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from enum import Enum

from keyturn.db import deletion as db
from keyturn.db.engine import Engine, connect
from keyturn.runtime.validation import check_key, parse_uuid

log = logging.getLogger(__name__)


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
    *, engine: Engine, request: DeletionRequest, tenant: str
) -> DeletionResult:
    key = request.idempotency_key
    async with connect(engine) as conn:
        earlier = await db.deleted_under(conn, tenant=tenant, key=key)
        if earlier is not None:
            return _judge(earlier, request)
        removal = await db.delete_session(
            conn, tenant=tenant, session_id=request.session_id, key=key
        )
        if removal.outcome is db.Removed.REMOVED:
            log.info(
                "session deleted",
                extra={"session_id": str(request.session_id), "idempotency_key": key}
                | {f"{table}_deleted": n for table, n in removal.rows.items()},
            )
            return DeletionResult(DeletionOutcome.DELETED)
        if removal.outcome is db.Removed.BUSY:
            return DeletionResult(DeletionOutcome.BUSY, running_turn_id=removal.running_turn_id)
        # Another deletion took the key, or deleted the session, while this one
        # waited: under this key that is a replay or a conflict; otherwise the
        # session is simply not there.
        earlier = await db.deleted_under(conn, tenant=tenant, key=key)
    if earlier is not None:
        return _judge(earlier, request)
    return DeletionResult(DeletionOutcome.SESSION_NOT_FOUND)
