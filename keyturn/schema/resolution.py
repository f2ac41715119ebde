"""The explicit resolution of an interrupted turn: its input, its answer and
its expected errors."""

from __future__ import annotations

from typing import Annotated, Any

import strawberry

from keyturn.runtime.resolution import ResolutionOutcome, ResolutionResult
from keyturn.schema.conversion import converted_once
from keyturn.schema.enums import ErrorCode, ResolutionAction
from keyturn.schema.results import IdempotencyConflict, InvalidInput, UserError
from keyturn.schema.types import Turn


@converted_once
@strawberry.input
class ResolveInterruptedTurnInput:
    turn_id: strawberry.ID
    action: ResolutionAction
    idempotency_key: str = strawberry.field(
        description="Names this one decision. Send the same key to retry the request."
    )
    force: bool = strawberry.field(
        default=False,
        description="RETRY: run again even calls of UNSAFE tools whose outcome is unknown.",
    )


@strawberry.type(
    description="The interrupted turn is resolved: abandoned, or retried by a new turn."
)
class TurnResolved:
    action: ResolutionAction
    turn: Turn = strawberry.field(description="The interrupted turn.")
    retry: Turn | None = strawberry.field(description="RETRY: the new turn.")
    replayed: bool = strawberry.field(
        description="The key already named this same decision: nothing was written."
    )


@strawberry.type
class TurnNotFound(UserError):
    turn_id: strawberry.ID


@strawberry.type(description="Only an INTERRUPTED turn can be resolved.")
class TurnNotInterrupted(UserError):
    turn_id: strawberry.ID
    status: str


@strawberry.type(description="Another key already resolved this turn.")
class TurnAlreadyResolved(UserError):
    turn_id: strawberry.ID
    action: ResolutionAction
    retry_turn_id: strawberry.ID | None


@strawberry.type(
    description="An UNSAFE call's outcome is unknown: running it again could repeat its "
    "effect. Nothing was written; send force: true to retry anyway."
)
class UnsafeRetryRefused(UserError):
    index: int
    tool: str
    effect_key: str


ResolveInterruptedTurnResult = Annotated[
    TurnResolved
    | IdempotencyConflict
    | TurnNotFound
    | TurnNotInterrupted
    | TurnAlreadyResolved
    | UnsafeRetryRefused
    | InvalidInput,
    strawberry.union("ResolveInterruptedTurnResult"),
]


def _id(value: Any) -> strawberry.ID:
    return strawberry.ID(str(value))


def from_resolution(
    result: ResolutionResult, *, turn_id: str, key: str, action: ResolutionAction
) -> ResolveInterruptedTurnResult:
    turn, res = result.turn, result.resolution
    if result.outcome in (ResolutionOutcome.ACCEPTED, ResolutionOutcome.REPLAYED) and turn and res:
        return TurnResolved(
            action=res.action,
            turn=Turn.from_record(turn),
            retry=Turn.from_record(result.retry) if result.retry is not None else None,
            replayed=result.outcome is ResolutionOutcome.REPLAYED,
        )
    if result.outcome is ResolutionOutcome.CONFLICT:
        existing = result.conflicting_turn_id
        return IdempotencyConflict(
            code=ErrorCode.IDEMPOTENCY_CONFLICT,
            message=(
                "this idempotency key already names a different request in this session "
                f"(turn {existing}); use a new key for a new decision"
            ),
            idempotency_key=key,
            existing_turn_id=_id(existing),
        )
    if result.outcome is ResolutionOutcome.NOT_INTERRUPTED and turn is not None:
        return TurnNotInterrupted(
            code=ErrorCode.TURN_NOT_INTERRUPTED,
            message=f"turn {turn.id} is {turn.status}; only an INTERRUPTED turn can be resolved",
            turn_id=_id(turn.id),
            status=turn.status,
        )
    if (
        result.outcome is ResolutionOutcome.ALREADY_RESOLVED
        and turn is not None
        and res is not None
    ):
        return TurnAlreadyResolved(
            code=ErrorCode.TURN_ALREADY_RESOLVED,
            message=f"turn {turn.id} was already resolved ({res.action}) under another key",
            turn_id=_id(turn.id),
            action=res.action,
            retry_turn_id=_id(res.new_turn_id) if res.new_turn_id else None,
        )
    if result.outcome is ResolutionOutcome.UNSAFE_REFUSED and result.unsafe_call is not None:
        call = result.unsafe_call
        return UnsafeRetryRefused(
            code=ErrorCode.UNSAFE_RETRY_REFUSED,
            message=(
                f"call {call.index} ({call.tool}, effect {call.effect_key}) is UNSAFE and its "
                "outcome is unknown: a retry could repeat it; send force: true to retry anyway"
            ),
            index=call.index,
            tool=call.tool,
            effect_key=call.effect_key,
        )
    return TurnNotFound(
        code=ErrorCode.TURN_NOT_FOUND, message=f"turn {turn_id} not found", turn_id=_id(turn_id)
    )
