"""Enums of the contract."""

from __future__ import annotations

from enum import Enum

import strawberry


@strawberry.enum(description="Which earlier turns the model sees.")
class HistoryMode(Enum):
    FULL = "FULL"  # the session's earlier completed (and interrupted) turns
    NONE = "NONE"  # only this turn's own input


@strawberry.enum
class TurnStatus(Enum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"


@strawberry.enum
class ErrorCode(Enum):
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
    INVALID_INPUT = "INVALID_INPUT"
    TURN_NOT_FOUND = "TURN_NOT_FOUND"
    TURN_NOT_INTERRUPTED = "TURN_NOT_INTERRUPTED"
    TURN_ALREADY_RESOLVED = "TURN_ALREADY_RESOLVED"
    UNSAFE_RETRY_REFUSED = "UNSAFE_RETRY_REFUSED"


@strawberry.enum(description="What running a tool call again would do.")
class ToolKind(Enum):
    READ_ONLY = "READ_ONLY"  # changes nothing
    IDEMPOTENT = "IDEMPOTENT"  # applies its effect key at most once; can be asked about it
    UNSAFE = "UNSAFE"  # may change something every time it runs


@strawberry.enum(description="What the tool ledger establishes about one call.")
class ToolCallState(Enum):
    NOT_STARTED = "NOT_STARTED"  # planned, no intent recorded: the tool did not run
    COMPLETED = "COMPLETED"  # intent and result recorded
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"  # intent without result: it may or may not have run
    RECONCILED_APPLIED = "RECONCILED_APPLIED"  # unknown, then the tool said: applied
    RECONCILED_NOT_APPLIED = "RECONCILED_NOT_APPLIED"  # unknown, then the tool said: never


@strawberry.enum
class ResolutionAction(Enum):
    RETRY = "RETRY"  # a new turn, reusing what the interrupted one established
    ABANDON = "ABANDON"  # record turn.abandoned; nothing runs
