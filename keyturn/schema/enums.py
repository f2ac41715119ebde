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
