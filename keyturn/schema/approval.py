"""Approval of tool calls: decideToolCall's input, its answer and its expected
errors, and the calls that wait (Query.pendingApprovals)."""

from __future__ import annotations

from typing import Annotated, Any, cast

import strawberry
from strawberry.scalars import JSON

from keyturn.resolvers.pagination import Page
from keyturn.runtime.approval import (
    DecisionOutcome,
    DecisionResult,
    PendingApproval,
    ToolCallDecision,
)
from keyturn.schema.budget import large
from keyturn.schema.conversion import converted_once
from keyturn.schema.enums import ErrorCode, ToolKind
from keyturn.schema.resolution import TurnNotFound
from keyturn.schema.results import IdempotencyConflict, InvalidInput, UserError
from keyturn.schema.types import PageInfo, Turn

strawberry.enum(
    ToolCallDecision,
    name="ToolCallDecision",
    description="APPROVE: the call runs. REJECT: it never runs; the model is told it was refused.",
)


@converted_once
@strawberry.input
class DecideToolCallInput:
    turn_id: strawberry.ID
    index: int = strawberry.field(description="The call's index in the turn (ToolCall.index).")
    decision: ToolCallDecision
    idempotency_key: str = strawberry.field(
        description="Names this one decision in the turn's session. Send the same key to "
        "retry the request."
    )
    note: str | None = strawberry.field(
        default=None,
        description="Why; a rejection shows it to the model (at most 2000 characters).",
    )


@strawberry.type(
    description="The decision is recorded (tool.approved or tool.rejected) and the turn is "
    "queued again, to be resumed by any process."
)
class ToolCallDecided:
    turn: Turn
    index: int
    decision: ToolCallDecision
    replayed: bool = strawberry.field(
        description="The key already named this same decision: nothing was written."
    )


@strawberry.type(description="Another key already decided this call: its decision stands.")
class ToolCallAlreadyDecided(UserError):
    turn_id: strawberry.ID
    index: int
    decision: ToolCallDecision


@strawberry.type(description="The call does not wait for a decision: nothing was written.")
class ToolCallNotAwaitingApproval(UserError):
    turn_id: strawberry.ID
    index: int
    status: str = strawberry.field(description="The turn's status.")


DecideToolCallResult = Annotated[
    ToolCallDecided
    | IdempotencyConflict
    | TurnNotFound
    | ToolCallAlreadyDecided
    | ToolCallNotAwaitingApproval
    | InvalidInput,
    strawberry.union("DecideToolCallResult"),
]


def _id(value: Any) -> strawberry.ID:
    return strawberry.ID(str(value))


def from_decision(result: DecisionResult, *, turn_id: str, key: str) -> DecideToolCallResult:
    turn = result.turn
    if (
        result.outcome in (DecisionOutcome.ACCEPTED, DecisionOutcome.REPLAYED)
        and turn is not None
        and result.decision is not None
    ):
        return ToolCallDecided(
            turn=Turn.from_record(turn),
            index=result.index,
            decision=result.decision,
            replayed=result.outcome is DecisionOutcome.REPLAYED,
        )
    if result.outcome is DecisionOutcome.CONFLICT:
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
    if (
        result.outcome is DecisionOutcome.ALREADY_DECIDED
        and turn is not None
        and result.decision is not None
    ):
        return ToolCallAlreadyDecided(
            code=ErrorCode.TOOL_CALL_ALREADY_DECIDED,
            message=(
                f"call {result.index} of turn {turn.id} was already decided "
                f"({result.decision}) under another key"
            ),
            turn_id=_id(turn.id),
            index=result.index,
            decision=result.decision,
        )
    if result.outcome is DecisionOutcome.NOT_AWAITING and turn is not None:
        return ToolCallNotAwaitingApproval(
            code=ErrorCode.TOOL_CALL_NOT_AWAITING_APPROVAL,
            message=(
                f"call {result.index} of turn {turn.id} does not wait for a decision "
                f"(the turn is {turn.status})"
            ),
            turn_id=_id(turn.id),
            index=result.index,
            status=turn.status,
        )
    return TurnNotFound(
        code=ErrorCode.TURN_NOT_FOUND, message=f"turn {turn_id} not found", turn_id=_id(turn_id)
    )


@strawberry.type(description="A tool call that waits for decideToolCall.")
class PendingApprovalCall:
    turn: Turn = strawberry.field(description="Its turn, WAITING.")
    index: int
    tool: str
    arguments: JSON = strawberry.field(extensions=large())
    kind: ToolKind
    effect_key: str

    @classmethod
    def from_pending(cls, p: PendingApproval) -> PendingApprovalCall:
        return cls(
            turn=Turn.from_record(p.turn),
            index=p.index,
            tool=p.tool,
            arguments=cast(JSON, p.arguments),
            kind=p.kind,
            effect_key=p.effect_key,
        )


@strawberry.type
class PendingApprovalEdge:
    cursor: str
    node: PendingApprovalCall


@strawberry.type
class PendingApprovalConnection:
    edges: list[PendingApprovalEdge]
    page_info: PageInfo

    @classmethod
    def from_page(cls, page: Page[PendingApproval]) -> PendingApprovalConnection:
        edges = [
            PendingApprovalEdge(cursor=c, node=PendingApprovalCall.from_pending(p))
            for c, p in zip(page.cursors, page.items, strict=True)
        ]
        return cls(
            edges=edges,
            page_info=PageInfo(
                has_next_page=page.has_next,
                has_previous_page=page.has_previous,
                start_cursor=page.cursors[0] if page.cursors else None,
                end_cursor=page.cursors[-1] if page.cursors else None,
            ),
        )
