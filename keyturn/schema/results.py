"""Admission results and the expected errors that are part of the schema."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import strawberry

from keyturn.runtime.admission import Admission, AdmissionOutcome
from keyturn.schema.enums import ErrorCode
from keyturn.schema.types import Turn


@strawberry.interface
class TurnAdmission:
    turn: Turn
    replayed: bool


@strawberry.type(description="A new turn was admitted; its turn.started event is saved.")
class TurnAccepted(TurnAdmission):
    pass


@strawberry.type(
    description="The key already named this same request: the original turn, nothing written."
)
class TurnReplayed(TurnAdmission):
    pass


@strawberry.interface
class UserError:
    code: ErrorCode
    message: str


@strawberry.type(description="The key already names a different request in this session.")
class IdempotencyConflict(UserError):
    idempotency_key: str
    existing_turn_id: strawberry.ID


@strawberry.type(
    description="The key's turn ended more than the server's key retention ago "
    "(Query.serverPolicy): the key is spent, whatever the request; nothing was written. "
    "Use a new key for a new turn."
)
class KeyExpired(UserError):
    idempotency_key: str
    turn_id: strawberry.ID = strawberry.field(
        description="The turn the key named (it may have been pruned since)."
    )
    expired_at: datetime = strawberry.field(description="When the key stopped answering replays.")


@strawberry.type
class SessionNotFound(UserError):
    session_id: strawberry.ID


@strawberry.type
class InvalidInput(UserError):
    field: str


@strawberry.type(
    description="A turn of the session keeps it busy. From submitTurn with multitask REJECT: "
    "a turn is queued or running, nothing was written; try again once it ends. From "
    "deleteSession: the running turn was asked to stop (its cancel is recorded, nothing else "
    "was written) and has not stopped within the server's wait; retry with the same key."
)
class SessionBusy(UserError):
    session_id: strawberry.ID
    turn_id: strawberry.ID = strawberry.field(description="The turn that keeps the session busy.")


SubmitTurnResult = Annotated[
    TurnAccepted
    | TurnReplayed
    | IdempotencyConflict
    | SessionNotFound
    | InvalidInput
    | KeyExpired
    | SessionBusy,
    strawberry.union("SubmitTurnResult"),
]


def from_admission(admission: Admission, *, session_id: str, key: str) -> SubmitTurnResult:
    turn = admission.turn
    if admission.outcome is AdmissionOutcome.ACCEPTED and turn is not None:
        return TurnAccepted(turn=Turn.from_record(turn), replayed=False)
    if admission.outcome is AdmissionOutcome.REPLAYED and turn is not None:
        return TurnReplayed(turn=Turn.from_record(turn), replayed=True)
    existing = turn.id if turn is not None else admission.conflicting_turn_id
    if admission.outcome is AdmissionOutcome.CONFLICT and existing is not None:
        return IdempotencyConflict(
            code=ErrorCode.IDEMPOTENCY_CONFLICT,
            message=(
                "this idempotency key already names a different request in this session "
                f"(turn {existing}); use a new key for a new turn"
            ),
            idempotency_key=key,
            existing_turn_id=strawberry.ID(str(existing)),
        )
    if admission.outcome is AdmissionOutcome.BUSY and admission.busy_turn_id is not None:
        busy = admission.busy_turn_id
        return SessionBusy(
            code=ErrorCode.SESSION_BUSY,
            message=(
                f"session {session_id} has a queued or running turn ({busy}) and the "
                "submission's multitask is REJECT; nothing was written. Submit again once it "
                "has ended"
            ),
            session_id=strawberry.ID(session_id),
            turn_id=strawberry.ID(str(busy)),
        )
    if admission.outcome is AdmissionOutcome.EXPIRED and admission.expiry is not None:
        expiry = admission.expiry
        return KeyExpired(
            code=ErrorCode.KEY_EXPIRED,
            message=(
                f"this idempotency key named turn {expiry.turn_id}, which ended at "
                f"{expiry.ended_at.isoformat()}; the key stopped answering replays at "
                f"{expiry.expired_at.isoformat()}. Use a new key for a new turn"
            ),
            idempotency_key=key,
            turn_id=strawberry.ID(str(expiry.turn_id)),
            expired_at=expiry.expired_at,
        )
    return SessionNotFound(
        code=ErrorCode.SESSION_NOT_FOUND,
        message=f"session {session_id} not found",
        session_id=strawberry.ID(session_id),
    )
