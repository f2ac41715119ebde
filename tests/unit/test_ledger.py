"""What the tool ledger's events establish, the fixture's tool directives,
the crash hook's configuration and the experiment's verdicts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from keyturn.db.records import EventRecord as Event
from keyturn.domain import History, ToolCallState
from keyturn.ops.experiment import verdict
from keyturn.runtime.crash import CrashHook
from keyturn.runtime.ledger import tool_calls
from keyturn.runtime.model import FixtureModel, Round, ToolOutcome, ToolRequest, tool_directives

SID = uuid.uuid4()


def events(*pairs: tuple[str, dict[str, Any]]) -> list[Event]:
    return [
        Event(
            id=n,
            session_id=SID,
            turn_id=None,
            seq=n,
            type=t,
            data=d,
            created_at=datetime.now(UTC),
        )
        for n, (t, d) in enumerate(pairs, 1)
    ]


def call(index: int, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "tool": "synthetic_write",
        "arguments": {"name": "a", "value": "1"},
        "kind": "IDEMPOTENT",
        "effectKey": f"t/{index}",
        **extra,
    }


def test_states_follow_the_events() -> None:
    log = events(
        ("turn.started", {}),
        ("tool.planned", {"calls": [call(0), call(1), call(2), call(3)]}),
        ("tool.intent", call(0)),
        ("tool.result", call(0, result={"applied": True})),
        ("tool.intent", call(1)),
        ("tool.intent", call(2)),
        ("tool.reconciled", {"index": 2, "effectKey": "t/2", "applied": False}),
    )
    states = [(c.index, c.state) for c in tool_calls(log)]
    assert states == [
        (0, ToolCallState.COMPLETED),
        (1, ToolCallState.OUTCOME_UNKNOWN),
        (2, ToolCallState.RECONCILED_NOT_APPLIED),
        (3, ToolCallState.NOT_STARTED),
    ]
    assert tool_calls(log)[2].tool == "synthetic_write"  # kept from the intent
    assert tool_calls(log)[0].result == {"applied": True}


def test_a_reused_result_is_completed_and_names_its_origin() -> None:
    [reused] = tool_calls(events(("tool.result", call(0, reused=True, reusedFrom="orig"))))
    assert (reused.state, reused.reused_from) == (ToolCallState.COMPLETED, "orig")


def test_directives_become_tool_calls_in_order() -> None:
    assert tool_directives("/write a=1 then /append b=2 /read a") == [
        ToolRequest("synthetic_write", {"name": "a", "value": "1"}),
        ToolRequest("synthetic_append", {"name": "b", "value": "2"}),
        ToolRequest("synthetic_read", {"name": "a"}),
    ]
    assert tool_directives("a/write x=1 and /writes y=2") == []


async def test_the_fixture_asks_for_its_calls_then_replies_with_their_results() -> None:
    model = FixtureModel()
    said: list[str] = []

    async def emit(text: str) -> None:
        said.append(text)

    async def step(rounds: list[Round]) -> list[ToolRequest]:
        return await model.step(
            input="/write a=1", mode=History.FULL, history=[], rounds=rounds, tools=[], emit=emit
        )

    assert await step([]) == [ToolRequest("synthetic_write", {"name": "a", "value": "1"})]
    assert said == []  # no text in a round that only asks for tools
    done = (ToolOutcome(0, "synthetic_write", {"name": "a", "value": "1"}, {"applied": True}),)
    assert await step([Round("", done)]) == []
    assert await step([Round("", done)]) == []
    reply = said[0]
    assert said == [reply, reply]  # the same reply for the same results
    assert 'tool 0 synthetic_write {"name": "a", "value": "1"}: {"applied": true}' in reply
    # Without tools the reply is the input and the history line alone.
    assert await model.reply(input="hi", mode=History.FULL, history=[]) == (
        "fixture reply to: hi\nhistory: FULL, no earlier turns"
    )


def test_crash_hook_configuration() -> None:
    hook = CrashHook("after_write:1", after=3)
    assert (hook.point_name, hook.index, hook.after) == ("after_write", 1, 3)
    assert CrashHook().point_name is None
    with pytest.raises(ValueError):
        CrashHook("halfway")


@pytest.mark.parametrize(
    ("state", "applied", "expected"),
    [
        ("COMPLETED", 1, "agreed"),
        ("COMPLETED", 0, "contradicted"),
        ("RECONCILED_APPLIED", 1, "agreed"),
        ("RECONCILED_NOT_APPLIED", 0, "agreed"),
        ("RECONCILED_NOT_APPLIED", 1, "contradicted"),
        ("NOT_STARTED", 1, "contradicted"),
        (None, 0, "agreed"),
        ("OUTCOME_UNKNOWN", 0, "uncertain"),
        ("OUTCOME_UNKNOWN", 1, "uncertain"),
        ("OUTCOME_UNKNOWN", 2, "contradicted"),
    ],
)
def test_verdicts(state: str | None, applied: int, expected: str) -> None:
    assert verdict(state, applied) == expected
