"""Keyturn's vocabulary: every status, event type and kind, spelt once.

A leaf: it imports nothing from Keyturn. The database refuses a status or an
event type that is not listed here (CHECK constraints, migration 0004; a
migration test keeps the two equal), and the GraphQL schema registers these
enums as they are rather than mirroring them.
"""

from __future__ import annotations

from enum import StrEnum


class TurnStatus(StrEnum):
    QUEUED = "QUEUED"  # admitted; waits for the session's earlier turns
    RUNNING = "RUNNING"  # claimed by a process that holds its lease
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"  # its process stopped renewing the lease; never re-run
    CANCELLED = "CANCELLED"  # stopped on a client's request (cancelTurn)
    WAITING = "WAITING"  # waits for a decision on a tool call; holds no lease


# A turn in one of these states changes no more (a resolution adds a new turn).
TERMINAL_STATUSES = frozenset(
    {TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.INTERRUPTED, TurnStatus.CANCELLED}
)


class EventType(StrEnum):
    TURN_STARTED = "turn.started"  # admitted, before the answer
    TURN_RUNNING = "turn.running"  # a process claimed it
    TURN_DELTA = "turn.delta"  # a piece of the output, recorded while the model streams
    TURN_COMPLETED = "turn.completed"
    TURN_FAILED = "turn.failed"
    TURN_INTERRUPTED = "turn.interrupted"  # its lease ran out
    TURN_RELEASED = "turn.released"  # a stopping process handed it back to the queue
    TURN_WRITE_REFUSED = "turn.write_refused"  # a stale epoch tried to write
    TURN_RETRIED = "turn.retried"
    TURN_ABANDONED = "turn.abandoned"
    TURN_CANCEL_REQUESTED = (
        "turn.cancel_requested"  # a client asked; the runner stops at a safe point
    )
    TURN_CANCELLED = "turn.cancelled"
    TOOL_PLANNED = "tool.planned"
    TOOL_INTENT = "tool.intent"  # committed before the tool runs
    TOOL_RESULT = "tool.result"  # committed after it returns
    TOOL_RECONCILED = "tool.reconciled"  # an idempotent tool was asked about an unknown outcome
    TOOL_APPROVAL_REQUESTED = "tool.approval_requested"  # the turn waits for a decision
    TOOL_APPROVED = "tool.approved"
    TOOL_REJECTED = "tool.rejected"


# The event that ends a turn, one per status it can end in.
TERMINAL_EVENTS = frozenset(
    {
        EventType.TURN_COMPLETED,
        EventType.TURN_FAILED,
        EventType.TURN_INTERRUPTED,
        EventType.TURN_CANCELLED,
    }
)
# At most one of each per call of a turn (a unique index on the events table).
ONCE_PER_CALL_EVENTS = (EventType.TOOL_INTENT, EventType.TOOL_RESULT, EventType.TOOL_RECONCILED)


class History(StrEnum):
    FULL = "FULL"  # the session's earlier completed (and interrupted, and cancelled) turns
    NONE = "NONE"  # only this turn's own input


class Multitask(StrEnum):
    """What a submission does while its session already has a turn queued or running."""

    ENQUEUE = "ENQUEUE"  # wait behind it (the default)
    REJECT = "REJECT"  # refuse the submission (SessionBusy); nothing is written
    INTERRUPT = "INTERRUPT"  # cancel what is queued or running, then run the new turn


# A turn in one of these states keeps its session busy.
ACTIVE_STATUSES = frozenset({TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.WAITING})


class ToolKind(StrEnum):
    READ_ONLY = "READ_ONLY"  # changes nothing
    # Repeating a call with the same arguments adds no effect (MCP's
    # idempotentHint), but nobody can ask whether a call happened.
    REPEATABLE = "REPEATABLE"
    IDEMPOTENT = "IDEMPOTENT"  # applies its effect key at most once; can be asked about it
    UNSAFE = "UNSAFE"  # may change something every time it runs


class ToolCallState(StrEnum):
    NOT_STARTED = "NOT_STARTED"  # planned, no intent recorded: the tool did not run
    COMPLETED = "COMPLETED"  # intent and result recorded
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"  # intent without an answer: it may or may not have run
    RECONCILED_APPLIED = "RECONCILED_APPLIED"  # unknown, then the tool said: applied
    RECONCILED_NOT_APPLIED = "RECONCILED_NOT_APPLIED"  # unknown, then the tool said: never
    AWAITING_APPROVAL = "AWAITING_APPROVAL"  # planned; waits for decideToolCall
    REJECTED = "REJECTED"  # a person or client refused it; it never ran


class KeyKind(StrEnum):
    """What took a key in a session's one namespace of keys (session_keys)."""

    TURN = "TURN"  # a submitted turn (submitTurn)
    RESOLUTION = "RESOLUTION"  # resolveInterruptedTurn (a RETRY's new turn shares it)
    CANCEL = "CANCEL"  # cancelTurn
    DECISION = "DECISION"  # decideToolCall


class ResolutionAction(StrEnum):
    RETRY = "RETRY"  # a new turn, reusing what the interrupted one established
    ABANDON = "ABANDON"  # record turn.abandoned; nothing runs
