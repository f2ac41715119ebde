"""What the ledger establishes about a call that was sent and never answered:
its ``tool.result`` is the error the model was shown, flagged."""

from __future__ import annotations

from typing import Any

from keyturn.domain import ToolCallState, ToolKind
from keyturn.runtime.ledger import tool_calls, unsafe_unknown
from tests.unit.test_ledger import events


def call(index: int, kind: ToolKind, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "tool": f"files__{kind.lower()}",
        "arguments": {},
        "kind": kind,
        "effectKey": f"t/{index}",
        **extra,
    }


UNKNOWN = {"error": "files__x did not answer within 1s; whether it acted is unknown"}


def test_a_result_flagged_unknown_leaves_the_call_unknown_with_what_the_model_was_shown() -> None:
    log = events(
        ("tool.intent", call(0, ToolKind.REPEATABLE)),
        ("tool.result", call(0, ToolKind.REPEATABLE, result=UNKNOWN, outcomeUnknown=True)),
        ("tool.intent", call(1, ToolKind.UNSAFE)),
        ("tool.result", call(1, ToolKind.UNSAFE, result=UNKNOWN, outcomeUnknown=True)),
        ("tool.intent", call(2, ToolKind.UNSAFE)),
        ("tool.result", call(2, ToolKind.UNSAFE, result={"error": "refused"})),
    )
    calls = tool_calls(log)
    assert [(c.state, c.result) for c in calls] == [
        (ToolCallState.OUTCOME_UNKNOWN, UNKNOWN),
        (ToolCallState.OUTCOME_UNKNOWN, UNKNOWN),
        (ToolCallState.COMPLETED, {"error": "refused"}),  # an error the tool answered
    ]
    # A retry may not repeat the UNSAFE one unforced; the REPEATABLE one it may.
    refused = unsafe_unknown(calls)
    assert refused is not None and refused.index == 1


def test_an_answer_asked_for_at_once_settles_the_call_and_a_later_one_settles_an_unknown() -> None:
    applied = {"applied": True, "reconciled": True, "note": "…"}
    log = events(
        ("tool.intent", call(0, ToolKind.IDEMPOTENT)),
        (
            "tool.result",
            call(0, ToolKind.IDEMPOTENT, result=applied, reconciled=True, applied=True),
        ),
        ("tool.intent", call(1, ToolKind.IDEMPOTENT)),
        (
            "tool.result",
            call(1, ToolKind.IDEMPOTENT, result={"error": "…"}, reconciled=True, applied=False),
        ),
        ("tool.intent", call(2, ToolKind.IDEMPOTENT)),
        ("tool.result", call(2, ToolKind.IDEMPOTENT, result=UNKNOWN, outcomeUnknown=True)),
        # The turn was interrupted later, and the tool answered then.
        ("tool.reconciled", {"index": 2, "effectKey": "t/2", "applied": True}),
    )
    assert [(c.state, c.result) for c in tool_calls(log)] == [
        (ToolCallState.RECONCILED_APPLIED, applied),
        (ToolCallState.RECONCILED_NOT_APPLIED, {"error": "…"}),
        # The error saying it was unknown no longer stands for the call.
        (ToolCallState.RECONCILED_APPLIED, None),
    ]
