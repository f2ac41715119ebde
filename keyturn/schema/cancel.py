"""Cancelling a turn: its input, its answer and its expected errors."""

from __future__ import annotations

from typing import Annotated, Any

import strawberry

from keyturn.runtime.cancel import CancelOutcome, CancelResult
from keyturn.schema.conversion import converted_once
from keyturn.schema.enums import ErrorCode
from keyturn.schema.resolution import TurnNotFound
from keyturn.schema.results import IdempotencyConflict, InvalidInput, UserError
from keyturn.schema.types import Turn


@converted_once
@strawberry.input
class CancelTurnInput:
    turn_id: strawberry.ID
    idempotency_key: str = strawberry.field(
        description="Names this one cancel. Send the same key to retry the request."
    )
    reason: str | None = strawberry.field(
        default=None, description="Why, kept with the cancel (at most 1000 characters)."
    )


@strawberry.type(
    description="The cancel is recorded: the turn is CANCELLED (it had not started running), "
    "or it is RUNNING with cancelRequested and its process stops it at the next safe point, "
    "never between a tool's intent and its result."
)
class TurnCancellation:
    turn: Turn = strawberry.field(description="The turn as it stands.")
    replayed: bool = strawberry.field(
        description="The key already named this same cancel: nothing was written."
    )


@strawberry.type(description="The turn has ended (it did not end cancelled): nothing to cancel.")
class TurnNotCancellable(UserError):
    turn_id: strawberry.ID
    status: str


@strawberry.type(
    description="Another cancel (another key, or a submission's multitask INTERRUPT) already "
    "has this turn: nothing was written."
)
class TurnAlreadyCancelled(UserError):
    turn_id: strawberry.ID
    turn: Turn = strawberry.field(description="The turn as it stands.")


CancelTurnResult = Annotated[
    TurnCancellation
    | IdempotencyConflict
    | TurnNotFound
    | TurnNotCancellable
    | TurnAlreadyCancelled
    | InvalidInput,
    strawberry.union("CancelTurnResult"),
]


def _id(value: Any) -> strawberry.ID:
    return strawberry.ID(str(value))


def from_cancel(result: CancelResult, *, turn_id: str, key: str) -> CancelTurnResult:
    turn = result.turn
    if result.outcome in (CancelOutcome.CANCELLED, CancelOutcome.REPLAYED) and turn is not None:
        return TurnCancellation(
            turn=Turn.from_record(turn), replayed=result.outcome is CancelOutcome.REPLAYED
        )
    if result.outcome is CancelOutcome.CONFLICT:
        existing = result.conflicting_turn_id
        return IdempotencyConflict(
            code=ErrorCode.IDEMPOTENCY_CONFLICT,
            message=(
                "this idempotency key already names a different request in this session "
                f"(turn {existing}); use a new key for a new cancel"
            ),
            idempotency_key=key,
            existing_turn_id=_id(existing),
        )
    if result.outcome is CancelOutcome.NOT_CANCELLABLE and turn is not None:
        return TurnNotCancellable(
            code=ErrorCode.TURN_NOT_CANCELLABLE,
            message=f"turn {turn.id} is {turn.status}: it has ended, nothing to cancel",
            turn_id=_id(turn.id),
            status=turn.status,
        )
    if result.outcome is CancelOutcome.ALREADY_CANCELLED and turn is not None:
        return TurnAlreadyCancelled(
            code=ErrorCode.TURN_ALREADY_CANCELLED,
            message=f"turn {turn.id} was already cancelled by another request",
            turn_id=_id(turn.id),
            turn=Turn.from_record(turn),
        )
    return TurnNotFound(
        code=ErrorCode.TURN_NOT_FOUND, message=f"turn {turn_id} not found", turn_id=_id(turn_id)
    )
