"""Deleting a session: its input, its answer and its expected errors."""

from __future__ import annotations

from typing import Annotated

import strawberry

from keyturn.runtime.deletion import DeletionOutcome, DeletionResult
from keyturn.schema.conversion import converted_once
from keyturn.schema.enums import ErrorCode
from keyturn.schema.results import InvalidInput, SessionBusy, SessionNotFound, UserError


@converted_once
@strawberry.input
class DeleteSessionInput:
    session_id: strawberry.ID
    idempotency_key: str = strawberry.field(
        description="Names this one deletion. Send the same key to retry the request."
    )


@strawberry.type(
    description="The session is deleted with its turns, events and keys: every read of it "
    "now answers as for a session that never existed."
)
class SessionDeleted:
    session_id: strawberry.ID
    replayed: bool = strawberry.field(
        description="The key already named this same deletion: nothing was written."
    )


@strawberry.type(
    description="The key already named the deletion of another session (code "
    "IDEMPOTENCY_CONFLICT): nothing was written. Use a new key for a new deletion."
)
class DeletionKeyConflict(UserError):
    idempotency_key: str
    existing_session_id: strawberry.ID = strawberry.field(
        description="The session this key deleted."
    )


DeleteSessionResult = Annotated[
    SessionDeleted | SessionBusy | DeletionKeyConflict | SessionNotFound | InvalidInput,
    strawberry.union("DeleteSessionResult"),
]


def from_deletion(result: DeletionResult, *, session_id: str, key: str) -> DeleteSessionResult:
    sid = strawberry.ID(session_id)
    if result.outcome in (DeletionOutcome.DELETED, DeletionOutcome.REPLAYED):
        return SessionDeleted(session_id=sid, replayed=result.outcome is DeletionOutcome.REPLAYED)
    if result.outcome is DeletionOutcome.CONFLICT:
        other = str(result.conflicting_session_id)
        return DeletionKeyConflict(
            code=ErrorCode.IDEMPOTENCY_CONFLICT,
            message=(
                f"this idempotency key already deleted another session ({other}); "
                "use a new key for a new deletion"
            ),
            idempotency_key=key,
            existing_session_id=strawberry.ID(other),
        )
    if result.outcome is DeletionOutcome.BUSY:
        turn = str(result.running_turn_id)
        return SessionBusy(
            code=ErrorCode.SESSION_BUSY,
            message=(
                f"session {session_id}: its running turn {turn} was asked to stop (the cancel "
                "is recorded) and has not stopped yet; nothing else was written. "
                "Retry with the same idempotency key to go on with the deletion"
            ),
            session_id=sid,
            turn_id=strawberry.ID(turn),
        )
    return SessionNotFound(
        code=ErrorCode.SESSION_NOT_FOUND,
        message=f"session {session_id} not found",
        session_id=sid,
    )
