"""The tool ledger, read: what a turn's ``tool.*`` events establish about each call.

Pure: a projection of events, with no database and no tool. The runner that
writes the ledger is :mod:`keyturn.runtime.tool_runner`.

For every call the runtime commits ``tool.intent`` (tool, arguments, kind and
an effect key derived from the turn id and the call's index) before the tool
runs, and ``tool.result`` after it returns. An intent without a result is an
outcome nobody knows: the process may have stopped before the tool ran, while
it ran, or after. So is a call that was sent and never answered (it timed
out, its server died, it raised): its ``tool.result`` is the error the model
was shown, flagged ``outcomeUnknown``, and the call stays OUTCOME_UNKNOWN,
its result kept. An IDEMPOTENT tool is asked about such a call at once; its
answer is in that ``tool.result`` (``reconciled`` and ``applied``) and the
call is RECONCILED_APPLIED or RECONCILED_NOT_APPLIED. Once a turn is
INTERRUPTED, IDEMPOTENT tools are asked about the effect key of every call
still unknown and the answer is saved as ``tool.reconciled``; for the others
the record keeps saying OUTCOME_UNKNOWN, and what a retry may do depends on
the kind recorded in the intent: READ_ONLY and REPEATABLE calls run again (a
repeat adds no effect), an UNSAFE one only when the client forces it.

A call that needs approval (:mod:`keyturn.runtime.approval`) is
AWAITING_APPROVAL from its ``tool.approval_requested`` until a decision:
``tool.approved`` makes it NOT_STARTED again until its intent, and
``tool.rejected`` makes it REJECTED, with the refusal the model was shown as
its result; a rejected call never has an intent.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keyturn.db.records import EventRecord
from keyturn.domain import EventType, ToolCallState, ToolKind


@dataclass(frozen=True, slots=True)
class ToolCallView:
    """One call of a turn, as its ledger events establish it."""

    index: int
    tool: str
    arguments: dict[str, Any]
    effect_key: str
    kind: ToolKind
    state: ToolCallState
    # What the model was shown of it: a result, an error saying its outcome
    # is unknown, or a refusal; None while it has none.
    result: dict[str, Any] | None = None
    reused_from: str | None = None  # the turn whose result this call reused


# What a ``tool.result`` flags about the effect, when it is not the tool's answer.
OUTCOME_UNKNOWN = "outcomeUnknown"
RECONCILED = "reconciled"
APPLIED = "applied"


def result_state(data: dict[str, Any]) -> ToolCallState:
    """The state a ``tool.result`` establishes: COMPLETED for a tool's answer
    (an error it answered included); for a call that was never answered,
    unknown, or what the IDEMPOTENT tool said when it was asked at once."""
    if data.get(OUTCOME_UNKNOWN):
        return ToolCallState.OUTCOME_UNKNOWN
    if data.get(RECONCILED):
        return (
            ToolCallState.RECONCILED_APPLIED
            if data.get(APPLIED)
            else ToolCallState.RECONCILED_NOT_APPLIED
        )
    return ToolCallState.COMPLETED


def effect_key(turn_id: uuid.UUID, index: int) -> str:
    """Stable across restarts: the same turn's call i always has this key."""
    return f"{turn_id}/{index}"


def tool_calls(events: Sequence[EventRecord]) -> list[ToolCallView]:
    """The calls a turn's events establish, by index."""
    calls: dict[int, ToolCallView] = {}

    def view(d: dict[str, Any], state: ToolCallState, **extra: Any) -> ToolCallView:
        before = calls.get(int(d["index"]))
        return ToolCallView(
            index=int(d["index"]),
            tool=str(d.get("tool", before.tool if before else "")),
            arguments=dict(d.get("arguments", before.arguments if before else {})),
            effect_key=str(d.get("effectKey", before.effect_key if before else "")),
            kind=ToolKind(d.get("kind", before.kind if before else ToolKind.UNSAFE)),
            state=state,
            **extra,
        )

    for event in sorted(events, key=lambda e: e.seq):
        d = event.data
        if event.type == EventType.TOOL_PLANNED:
            for planned in d.get("calls", []):
                if int(planned["index"]) not in calls:
                    calls[int(planned["index"])] = view(planned, ToolCallState.NOT_STARTED)
        elif event.type == EventType.TOOL_INTENT:
            calls[int(d["index"])] = view(d, ToolCallState.OUTCOME_UNKNOWN)
        elif event.type == EventType.TOOL_RESULT:
            calls[int(d["index"])] = view(
                d,
                result_state(d),
                result=d.get("result"),
                reused_from=d.get("reusedFrom"),
            )
        elif event.type == EventType.TOOL_APPROVAL_REQUESTED:
            calls[int(d["index"])] = view(d, ToolCallState.AWAITING_APPROVAL)
        elif event.type == EventType.TOOL_APPROVED:
            # Allowed, not yet run: its intent comes when the turn resumes.
            calls[int(d["index"])] = view(d, ToolCallState.NOT_STARTED)
        elif event.type == EventType.TOOL_REJECTED:
            calls[int(d["index"])] = view(d, ToolCallState.REJECTED, result=d.get("result"))
        elif event.type == EventType.TOOL_RECONCILED:
            # Settles an interrupted turn's unknown call, one with a result
            # saying so included; that result (an error saying the outcome is
            # unknown) no longer stands for the call.
            state = (
                ToolCallState.RECONCILED_APPLIED
                if d.get("applied")
                else ToolCallState.RECONCILED_NOT_APPLIED
            )
            calls[int(d["index"])] = view(d, state)
    return [calls[i] for i in sorted(calls)]


def unsafe_unknown(calls: Sequence[ToolCallView]) -> ToolCallView | None:
    """The first call a retry must not repeat without being told to: an
    UNSAFE call of unknown outcome, whether it has no result or a result
    saying so. READ_ONLY and REPEATABLE ones may run again; an IDEMPOTENT one
    runs again under its own key, applied at most once."""
    for call in calls:
        if call.state is ToolCallState.OUTCOME_UNKNOWN and call.kind is ToolKind.UNSAFE:
            return call
    return None
