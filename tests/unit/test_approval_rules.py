"""Which calls wait for approval, what the tools file says of it, and what a
waiting or decided call's events establish."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from keyturn.db.records import EventRecord
from keyturn.domain import ToolCallState, ToolKind
from keyturn.errors import ToolsFileError
from keyturn.runtime.approval import ApprovalPolicy, refusal
from keyturn.runtime.ledger import tool_calls
from keyturn.runtime.tool_runner import _resumption
from keyturn.runtime.tools_file import load

SID = uuid.uuid4()


def events(*pairs: tuple[str, dict[str, Any]]) -> list[EventRecord]:
    return [
        EventRecord(n, SID, None, n, t, d, datetime.now(UTC)) for n, (t, d) in enumerate(pairs, 1)
    ]


def call(index: int, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "tool": "synthetic_append",
        "arguments": {"name": "a", "value": "1"},
        "kind": "UNSAFE",
        "effectKey": f"t/{index}",
        **extra,
    }


def test_unsafe_calls_wait_only_when_asked_and_the_file_decides_per_tool() -> None:
    assert not ApprovalPolicy().requires("synthetic_append", ToolKind.UNSAFE)
    every = ApprovalPolicy(approve_unsafe=True)
    assert every.requires("synthetic_append", ToolKind.UNSAFE)
    assert not every.requires("synthetic_write", ToolKind.IDEMPOTENT)
    named = ApprovalPolicy(
        approve_unsafe=True, tools={"synthetic_append": False, "synthetic_read": True}
    )
    assert not named.requires("synthetic_append", ToolKind.UNSAFE)
    assert named.requires("synthetic_read", ToolKind.READ_ONLY)


def test_the_tools_file_names_any_tool_for_approval(tmp_path: Path) -> None:
    path = tmp_path / "tools.toml"
    path.write_text(
        '[servers.files]\ncommand = ["files"]\n\n'
        '[tools."files__delete"]\nkind = "UNSAFE"\napprove = true\n\n'
        '[tools."synthetic_append"]\napprove = false\n'
    )
    loaded = load(path)
    assert loaded.approvals == {"files__delete": True, "synthetic_append": False}
    assert set(loaded.overrides) == {"files__delete"}
    assert loaded.overrides["files__delete"].kind is ToolKind.UNSAFE


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[tools."synthetic_append"]\napprove = "yes"\n', 'tools."synthetic_append".approve'),
        # A kind is still only for a tool of one of the file's servers.
        ('[tools."synthetic_append"]\nkind = "UNSAFE"\napprove = true\n', "SERVER__TOOL"),
    ],
)
def test_approve_mistakes_are_one_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "tools.toml"
    path.write_text(text)
    with pytest.raises(ToolsFileError) as raised:
        load(path)
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_waiting_call_then_its_decision() -> None:
    planned = ("tool.planned", {"index": 0, "calls": [call(0), call(1)]})
    waiting = tool_calls(events(planned, ("tool.approval_requested", call(0, epoch=1))))
    assert [c.state for c in waiting] == [
        ToolCallState.AWAITING_APPROVAL,
        ToolCallState.NOT_STARTED,
    ]
    approved = tool_calls(
        events(
            planned,
            ("tool.approval_requested", call(0, epoch=1)),
            ("tool.approved", {"index": 0, "tool": "synthetic_append", "effectKey": "t/0"}),
        )
    )
    assert approved[0].state is ToolCallState.NOT_STARTED
    assert approved[0].arguments == {"name": "a", "value": "1"}  # kept from the plan
    rejected = tool_calls(
        events(
            planned,
            ("tool.approval_requested", call(0, epoch=1)),
            ("tool.rejected", {"index": 0, "result": refusal("no")}),
        )
    )
    assert (rejected[0].state, rejected[0].result) == (
        ToolCallState.REJECTED,
        {"error": "refused by a person: no"},
    )
    assert rejected[0].tool == "synthetic_append"


def test_a_resumed_turn_rebuilds_its_rounds_and_text_from_the_record() -> None:
    log = events(
        ("turn.started", {}),
        ("turn.running", {"epoch": 1}),
        ("turn.delta", {"text": "Looking. ", "index": 0, "epoch": 1}),
        ("tool.planned", {"index": 0, "epoch": 1, "outputChars": 9, "calls": [call(0)]}),
        ("tool.approval_requested", call(0, epoch=1)),
        ("tool.approved", {"index": 0, "decision": "APPROVE", "epoch": 1}),
        ("turn.running", {"epoch": 2}),
        ("tool.intent", call(0, epoch=2)),
        ("tool.result", call(0, epoch=2, result={"applied": True})),
        ("turn.delta", {"text": "Now two. ", "index": 1, "epoch": 2}),
        (
            "tool.planned",
            {
                "index": 1,
                "epoch": 2,
                "outputChars": 18,
                "calls": [call(1, callId="c1"), call(2, callId="c2")],
            },
        ),
        ("tool.approval_requested", call(1, epoch=2)),
        ("tool.rejected", {"index": 1, "decision": "REJECT", "result": refusal("no")}),
    )
    resumed = _resumption(log)
    assert resumed.text == "Looking. Now two. "
    assert resumed.deltas == 2  # the next delta is numbered 2: none starts afresh
    assert [(r.text, [o.index for o in r.outcomes]) for r in resumed.rounds] == [("Looking. ", [0])]
    assert resumed.rounds[0].outcomes[0].result == {"applied": True}
    assert resumed.open is not None
    assert (resumed.open.first, resumed.open.text_start) == (1, 9)
    assert [r.call_id for r in resumed.open.requests] == ["c1", "c2"]
    assert resumed.made == 3
    assert resumed.known is not None and resumed.known[1].result == refusal("no")
    assert 2 not in resumed.known


def test_a_turn_that_never_asked_resumes_nothing() -> None:
    log = events(
        ("turn.running", {"epoch": 1}),
        ("tool.planned", {"index": 0, "epoch": 1, "calls": [call(0)]}),
        ("tool.approval_requested", call(0, epoch=1)),
        ("turn.released", {"epoch": 1}),
        ("turn.running", {"epoch": 2}),
    )
    # A turn handed back starts afresh: only what follows its release counts.
    assert _resumption(log).open is None
    assert _resumption(log).rounds == ()
