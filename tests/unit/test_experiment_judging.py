"""The interruption experiment's verdicts for MCP tools of each kind, for
turns cancelled mid-tool and for a retry racing reconciliation, its MCP
server's store (a SQLite file), and the test hook that holds a call in
flight: what each judges by."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from keyturn.ops.doctor import FAIL, check_settings
from keyturn.ops.experiment.judging import (
    cancel_findings,
    cancel_verdict,
    race_findings,
    race_verdict,
    read_verdict,
    set_verdict,
)
from keyturn.ops.experiment.sqlite_store import Store, Write
from keyturn.runtime.crash import CrashHook


@pytest.mark.parametrize(
    ("state", "held", "expected"),
    [
        ("COMPLETED", "v", "agreed"),
        ("COMPLETED", None, "contradicted"),
        ("NOT_STARTED", None, "agreed"),
        ("NOT_STARTED", "v", "contradicted"),
        (None, "v", "contradicted"),
        ("OUTCOME_UNKNOWN", None, "uncertain"),
        ("OUTCOME_UNKNOWN", "v", "uncertain"),
        # The call's own name holds another value: whatever the record says.
        ("OUTCOME_UNKNOWN", "w", "contradicted"),
        ("COMPLETED", "w", "contradicted"),
    ],
)
def test_a_repeatable_set_is_judged_by_the_value_it_leaves(
    state: str | None, held: str | None, expected: str
) -> None:
    assert set_verdict(state, held, "v") == expected


@pytest.mark.parametrize(
    ("state", "read", "after", "expected"),
    [
        ("COMPLETED", "seeded", "seeded", "agreed"),
        ("COMPLETED", None, "seeded", "contradicted"),  # it read something else
        ("COMPLETED", "seeded", "other", "contradicted"),  # the store changed
        ("OUTCOME_UNKNOWN", None, "seeded", "uncertain"),
        ("OUTCOME_UNKNOWN", None, "other", "contradicted"),
        ("NOT_STARTED", None, "seeded", "agreed"),
        ("RECONCILED_APPLIED", None, "seeded", "contradicted"),  # nobody asks a read
    ],
)
def test_a_read_is_judged_by_what_it_read_and_an_unchanged_store(
    state: str, read: str | None, after: str, expected: str
) -> None:
    assert read_verdict(state, read=read, before="seeded", after=after) == expected


def test_the_store_applies_a_key_at_most_once_and_a_no_is_final(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.sqlite3")
    assert store.write("t/0", "a", "1") is Write.APPLIED
    assert store.write("t/0", "a", "2") is Write.ALREADY_APPLIED
    assert store.settle("t/0") is True
    # Asked before any write: settled as never applied, and it stays so.
    assert store.settle("t/1") is False
    assert store.write("t/1", "b", "1") is Write.SETTLED_NOT_APPLIED
    assert store.settle("t/1") is False
    assert store.applied_counts(["t/0", "t/1", "t/2"]) == {"t/0": 1, "t/1": 0, "t/2": 0}
    # A second opening of the file (the replacement's server) sees the same.
    assert Store(store.path).applied_counts(["t/0", "t/1"]) == {"t/0": 1, "t/1": 0}


def test_the_store_sets_values_and_counts_every_append(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.sqlite3")
    assert store.read("a") is None
    store.set("a", "1")
    store.set("a", "1")
    assert store.values(["a", "b"]) == {"a": "1", "b": None}
    store.append("c", "1")
    store.append("c", "1")
    assert store.append_counts(["c", "d"]) == {"c": 2, "d": 0}


def _event(type: str, **data: Any) -> dict[str, Any]:
    return {"type": type, "data": data}


def _cancelled_turn() -> dict[str, Any]:
    """A turn of three calls cancelled while call 1 was in flight, as the
    promise says it ends: call 1 finished with its result, call 2 never started."""
    r0, r1 = {"applied": True}, {"applied": True}
    calls = [
        {"index": 0, "state": "COMPLETED", "result": r0},
        {"index": 1, "state": "COMPLETED", "result": r1},
        {"index": 2, "state": "NOT_STARTED", "result": None},
    ]
    return {
        "status": "CANCELLED",
        "output": None,
        "toolCalls": calls,
        "events": [
            _event("tool.planned", calls=[]),
            _event("tool.intent", index=0),
            _event("tool.result", index=0, result=r0),
            _event("tool.intent", index=1),
            _event("turn.cancel_requested", reason=None),
            _event("tool.result", index=1, result=r1),
            _event("turn.cancelled", output=None, inFlightCall=1, toolCalls=copy.deepcopy(calls)),
        ],
    }


def _end(turn: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = turn["events"][-1]["data"]
    return data


def _in_flight_unknown(turn: dict[str, Any]) -> None:
    # The cancel cut the call: no result, and the end says so too.
    turn["toolCalls"][1].update(state="OUTCOME_UNKNOWN", result=None)
    _end(turn)["toolCalls"][1].update(state="OUTCOME_UNKNOWN", result=None)
    del turn["events"][5]


def _later_started(turn: dict[str, Any]) -> None:
    turn["toolCalls"][2]["state"] = "COMPLETED"
    _end(turn)["toolCalls"][2]["state"] = "COMPLETED"
    turn["events"].insert(6, _event("tool.intent", index=2))


def _ran_on(turn: dict[str, Any]) -> None:
    turn["status"] = "COMPLETED"
    turn["events"][-1] = _event("turn.completed", output="fixture reply")


def _output_lost(turn: dict[str, Any]) -> None:
    turn["events"].insert(3, _event("turn.delta", text="so far", index=0))


def _cancel_after_result(turn: dict[str, Any]) -> None:
    events = turn["events"]
    events[4], events[5] = events[5], events[4]


def _end_names_no_call(turn: dict[str, Any]) -> None:
    _end(turn)["inFlightCall"] = None


def _end_says_other_states(turn: dict[str, Any]) -> None:
    _end(turn)["toolCalls"][1]["state"] = "OUTCOME_UNKNOWN"


@pytest.mark.parametrize(
    ("change", "judged", "expected"),
    [
        (None, "agreed", "agreed"),
        # The record and the store disagree: whatever else holds.
        (None, "contradicted", "contradicted"),
        # The record agrees with the store, but the cancel broke its promise.
        (_in_flight_unknown, "uncertain", "broken"),
        (_later_started, "agreed", "broken"),
        (_ran_on, "agreed", "broken"),
        (_output_lost, "agreed", "broken"),
        (_cancel_after_result, "agreed", "broken"),
        # The record disagrees with itself.
        (_end_names_no_call, "agreed", "contradicted"),
        (_end_says_other_states, "agreed", "contradicted"),
    ],
)
def test_a_call_in_flight_when_its_turn_is_cancelled_must_finish_and_be_recorded_so(
    change: Any, judged: str, expected: str
) -> None:
    turn = _cancelled_turn()
    if change is not None:
        change(turn)
    contradicts, broken = cancel_findings(turn, 1)
    assert cancel_verdict(judged, contradicts, broken) == expected, (contradicts, broken)
    if change is None:
        assert (contradicts, broken) == ([], [])


async def test_the_hold_hook_holds_a_call_until_its_file_appears(tmp_path: Path) -> None:
    release = tmp_path / "release"
    hook = CrashHook(hold_at="after_intent:1", hold_until=release)
    await hook.point("after_intent", 0)  # another call: not held
    await hook.point("after_write", 1)  # another point: not held
    held = asyncio.create_task(hook.point("after_intent", 1))
    await asyncio.sleep(0.2)
    assert not held.done()
    release.touch()
    await asyncio.wait_for(held, 10)
    await hook.point("after_intent", 1)  # once it exists, nothing is held


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"KEYTURN_HOLD_AT": "halfway", "KEYTURN_HOLD_UNTIL": "r"}, "KEYTURN_HOLD_AT must be"),
        ({"KEYTURN_HOLD_AT": "after_intent:x", "KEYTURN_HOLD_UNTIL": "r"}, "INDEX must be"),
        ({"KEYTURN_HOLD_AT": "after_intent"}, "KEYTURN_HOLD_AT needs KEYTURN_HOLD_UNTIL"),
        ({"KEYTURN_HOLD_UNTIL": "r"}, "KEYTURN_HOLD_UNTIL is set without KEYTURN_HOLD_AT"),
    ],
)
def test_a_bad_hold_setting_is_refused_before_the_server_starts(
    env: dict[str, str], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("KEYTURN_HOLD_AT", "KEYTURN_HOLD_UNTIL", "KEYTURN_CRASH_AT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # What `keyturn serve` checks first, and `keyturn doctor` shows.
    checks, _ = check_settings()
    refused = [c.detail for c in checks if c.status == FAIL]
    assert len(refused) == 1 and said in refused[0], checks
    if "halfway" in env.get("KEYTURN_HOLD_AT", ""):
        assert "before_intent, after_intent, after_write, after_result" in refused[0]


def _raced(applied: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
    """A turn cut at call 1 and its retry, sent while the answer about call
    1 was held, as the promise says they end: the earlier call settled first,
    then the retry reusing an applied effect, or running it under its own key."""
    settled = "RECONCILED_APPLIED" if applied else "RECONCILED_NOT_APPLIED"
    original: dict[str, Any] = {
        "status": "INTERRUPTED",
        "toolCalls": [
            {"index": 0, "state": "COMPLETED", "effectKey": "t/0"},
            {"index": 1, "state": settled, "effectKey": "t/1"},
        ],
        "events": [
            {"seq": 3, "type": "tool.intent", "data": {"index": 1}},
            {"seq": 6, "type": "tool.reconciled", "data": {"index": 1, "applied": applied}},
        ],
    }
    key = "t/1" if applied else "r/1"  # reused, or the retry's own
    retry: dict[str, Any] = {
        "status": "COMPLETED",
        "toolCalls": [
            {"index": 0, "state": "COMPLETED", "effectKey": "t/0"},
            {"index": 1, "state": "COMPLETED", "effectKey": key},
        ],
        "events": [
            {"seq": 8, "type": "tool.planned", "data": {"calls": [{"index": 0}, {"index": 1}]}},
            {"seq": 9, "type": "tool.result", "data": {"index": 0}},
            {"seq": 10, "type": "tool.result", "data": {"index": 1}},
        ],
    }  # fmt: skip
    if not applied:
        retry["events"].insert(2, {"seq": 9, "type": "tool.intent", "data": {"index": 1}})
    return original, retry, {"t/0": 1, "t/1": int(applied), "r/1": int(not applied)}


def _planned_first(original: dict[str, Any], retry: dict[str, Any], store: dict[str, int]) -> None:
    original["events"][1]["seq"] = 20  # settled only after the retry planned the call


def _refused_but_completed(
    original: dict[str, Any], retry: dict[str, Any], store: dict[str, int]
) -> None:
    store["r/1"] = 0  # the retry's write did not apply, and its call says COMPLETED


def _twice(original: dict[str, Any], retry: dict[str, Any], store: dict[str, int]) -> None:
    store["t/1"] = 1  # the old key applied after all, and the retry's too


def _unsettled(original: dict[str, Any], retry: dict[str, Any], store: dict[str, int]) -> None:
    original["toolCalls"][1]["state"] = "OUTCOME_UNKNOWN"
    del original["events"][1]


def _lost(original: dict[str, Any], retry: dict[str, Any], store: dict[str, int]) -> None:
    # The record says the truth (refused, never applied), but the write is lost.
    retry["toolCalls"][1]["state"] = "RECONCILED_NOT_APPLIED"
    store["r/1"] = 0


def _failed(original: dict[str, Any], retry: dict[str, Any], store: dict[str, int]) -> None:
    retry["status"] = "FAILED"


@pytest.mark.parametrize(
    ("applied", "change", "expected"),
    [
        (True, None, "agreed"),
        (False, None, "agreed"),
        (True, _planned_first, "contradicted"),
        (False, _planned_first, "contradicted"),
        (False, _refused_but_completed, "contradicted"),
        (False, _twice, "contradicted"),
        (True, _unsettled, "contradicted"),
        (False, _lost, "broken"),
        (False, _failed, "broken"),
    ],
)
def test_a_retry_racing_reconciliation_must_follow_the_settlement_and_apply_once(
    applied: bool, change: Any, expected: str
) -> None:
    original, retry, store = _raced(applied)
    if change is not None:
        change(original, retry, store)
    contradicts, broken = race_findings(original, retry, 1, store)
    assert race_verdict(contradicts, broken) == expected, (contradicts, broken)
    if change is None:
        assert (contradicts, broken) == ([], [])
