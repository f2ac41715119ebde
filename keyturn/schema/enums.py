"""The enums of the contract: Keyturn's own vocabulary (keyturn.domain),
registered as it is, and the codes of the expected errors."""

from __future__ import annotations

from enum import Enum

import strawberry

from keyturn.domain import (
    History,
    Multitask,
    ResolutionAction,
    ToolCallState,
    ToolKind,
    TurnStatus,
)

# Registered, not mirrored: a value added to the domain is in the schema (and
# the committed SDL snapshot's drift test says so).
strawberry.enum(History, name="HistoryMode", description="Which earlier turns the model sees.")
strawberry.enum(TurnStatus, name="TurnStatus")
strawberry.enum(ToolKind, name="ToolKind", description="What running a tool call again would do.")
strawberry.enum(
    ToolCallState,
    name="ToolCallState",
    description="What the tool ledger establishes about one call.",
)
strawberry.enum(ResolutionAction, name="ResolutionAction")
strawberry.enum(
    Multitask,
    name="Multitask",
    description="What a submission does while its session has a turn queued or running.",
)


@strawberry.enum
class ErrorCode(Enum):
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
    INVALID_INPUT = "INVALID_INPUT"
    TURN_NOT_FOUND = "TURN_NOT_FOUND"
    TURN_NOT_INTERRUPTED = "TURN_NOT_INTERRUPTED"
    TURN_ALREADY_RESOLVED = "TURN_ALREADY_RESOLVED"
    UNSAFE_RETRY_REFUSED = "UNSAFE_RETRY_REFUSED"
    KEY_EXPIRED = "KEY_EXPIRED"
    SESSION_BUSY = "SESSION_BUSY"
    TURN_NOT_CANCELLABLE = "TURN_NOT_CANCELLABLE"
    TURN_ALREADY_CANCELLED = "TURN_ALREADY_CANCELLED"
    TOOL_CALL_ALREADY_DECIDED = "TOOL_CALL_ALREADY_DECIDED"
    TOOL_CALL_NOT_AWAITING_APPROVAL = "TOOL_CALL_NOT_AWAITING_APPROVAL"


__all__ = [
    "ErrorCode",
    "History",
    "Multitask",
    "ResolutionAction",
    "ToolCallState",
    "ToolKind",
    "TurnStatus",
]
