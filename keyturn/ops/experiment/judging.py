"""Judging the interruption experiment: each call's record beside the store.

agreed        the record says the effect happened (COMPLETED, RECONCILED_APPLIED)
              and the store has it once, or says it did not (NOT_STARTED,
              RECONCILED_NOT_APPLIED) and the store has nothing
uncertain     the record says OUTCOME_UNKNOWN: it claims nothing
contradicted  anything else
broken        the cancelled turns only: the record agrees with the store and with
              itself, but the cancel did not keep its promise (the call in flight
              did not finish with its result, a later call started, the turn did
              not end CANCELLED, or the output so far was not kept)

What "has it" means depends on the kind of the tool:

==========  ==================================================================
IDEMPOTENT  how many times the call's effect key was applied (a key settled
            as never applied counts 0): reconciled states must match exactly
UNSAFE      how many effects the call left (appends under its own name)
REPEATABLE  whether the store holds the value the call set (its own name):
            present counts 1, absent 0, any other value is a contradiction
READ_ONLY   no effect to compare: a COMPLETED read must have read what the
            store holds, and the store must hold what it held before
==========  ==================================================================

A turn cancelled while its second call is held in flight is also judged
against itself and the promise (:func:`cancel_findings`): a ``turn.cancelled``
that names another call in flight, or gives other states, results or output
than the rest of the record, contradicts it; a call in flight that did not
finish, a later call that started, a turn that did not end CANCELLED or an
output that is not what its deltas streamed is broken.

A RETRY sent while the replacement's answer about the cut call was held
(:func:`race_findings`) is judged by both turns beside the store: the earlier
call must be settled (RECONCILED_APPLIED or RECONCILED_NOT_APPLIED, as its key
is in the store), and settled before the retry planned or ran that call; the
retry's call must agree with the store under its own effect key (COMPLETED
only if that key applied), and the effect must be in the store once across
both keys. An effect in the store twice, or a record that says otherwise
than the store, contradicts; an effect lost (neither key applied, and the
record says so) or a retry that did not complete is broken.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from keyturn.domain import EventType, ToolCallState, TurnStatus

HAPPENED = {ToolCallState.COMPLETED, ToolCallState.RECONCILED_APPLIED}
DID_NOT = {ToolCallState.NOT_STARTED, ToolCallState.RECONCILED_NOT_APPLIED}
# The second call of each turn: the one a crash cuts, or the one held in
# flight while its turn is cancelled (the cancelled turns make a third).
CRASHED_CALL = 1


def verdict(state: str | None, applied: int) -> str:
    """A call with a counted effect: ``applied`` is how many times the store has it."""
    if state == ToolCallState.OUTCOME_UNKNOWN:
        return "uncertain" if applied <= 1 else "contradicted"
    if state in HAPPENED:
        return "agreed" if applied == 1 else "contradicted"
    # NOT_STARTED, RECONCILED_NOT_APPLIED, or no record of the call at all
    return "agreed" if applied == 0 else "contradicted"


def set_verdict(state: str | None, held: str | None, value: str) -> str:
    """A REPEATABLE set of ``value``: ``held`` is what the store holds under its name."""
    if held is not None and held != value:
        return "contradicted"
    return verdict(state, 0 if held is None else 1)


def read_verdict(state: str | None, *, read: str | None, before: str | None,
                 after: str | None) -> str:  # fmt: skip
    """A READ_ONLY read: what the record says it read (``read``, for a
    COMPLETED call), what the store held before the turn and holds after."""
    if after != before:
        return "contradicted"  # a read changed the store
    if state == ToolCallState.OUTCOME_UNKNOWN:
        return "uncertain"
    if state == ToolCallState.COMPLETED:
        return "agreed" if read == after else "contradicted"
    # Nobody can be asked about a read: a reconciled one would be a contradiction.
    return "agreed" if state in (None, ToolCallState.NOT_STARTED) else "contradicted"


def cancel_findings(turn: dict[str, Any], held: int = CRASHED_CALL) -> tuple[list[str], list[str]]:
    """A turn cancelled while call ``held`` was in flight (the GraphQL Turn:
    ``status``, ``output``, ``events``, ``toolCalls``): where its record
    contradicts itself, and where the cancel broke its promise."""
    contradicts: list[str] = []
    broken: list[str] = []
    events = turn["events"]
    calls = {c["index"]: c for c in turn["toolCalls"]}
    seq = {
        (e["type"], e["data"].get("index")): n
        for n, e in enumerate(events)
        if e["type"] in (EventType.TOOL_INTENT, EventType.TOOL_RESULT)
    }
    asked = [n for n, e in enumerate(events) if e["type"] == EventType.TURN_CANCEL_REQUESTED]
    result_at = seq.get((EventType.TOOL_RESULT, held))
    if not asked or (result_at is not None and asked[0] > result_at):
        broken.append(f"turn.cancel_requested is not recorded before call {held}'s result")
    call = calls.get(held) or {}
    if call.get("state") != ToolCallState.COMPLETED or call.get("result") is None:
        broken.append(f"call {held}, in flight, did not finish with its result")
    for index, later in sorted(calls.items()):
        if index > held and (
            later["state"] != ToolCallState.NOT_STARTED or (EventType.TOOL_INTENT, index) in seq
        ):
            broken.append(f"call {index}, after the cancel, started")
    streamed = "".join(e["data"]["text"] for e in events if e["type"] == EventType.TURN_DELTA)
    if turn["output"] != (streamed or None):
        broken.append("the output is not what was streamed before the stop")
    ends = [e["data"] for e in events if e["type"] == EventType.TURN_CANCELLED]
    if turn["status"] != TurnStatus.CANCELLED or not ends:
        broken.append(f"the turn ended {turn['status']}, not CANCELLED")
        return contradicts, broken
    end = ends[-1]
    if end.get("inFlightCall") != held:
        contradicts.append(
            f"turn.cancelled names call {end.get('inFlightCall')} in flight, not {held}"
        )
    said = {c["index"]: (c["state"], c["result"]) for c in end.get("toolCalls") or []}
    if said != {i: (c["state"], c["result"]) for i, c in calls.items()}:
        contradicts.append("turn.cancelled gives other tool calls than Turn.toolCalls")
    if end.get("output") != turn["output"]:
        contradicts.append("turn.cancelled gives another output than Turn.output")
    return contradicts, broken


def cancel_verdict(judged: str, contradicts: list[str], broken: list[str]) -> str:
    """The in-flight call of a cancelled turn: ``judged`` is its record
    beside the store; the findings are :func:`cancel_findings`'."""
    if judged == "contradicted" or contradicts:
        return "contradicted"
    return "broken" if broken else judged


def _of_call(event: dict[str, Any], index: int) -> bool:
    """Whether a ``tool.*`` event is about call ``index`` (a plan, about any of its calls)."""
    data = event["data"]
    if event["type"] == EventType.TOOL_PLANNED:
        return any(c.get("index") == index for c in data.get("calls") or [])
    return bool(data.get("index") == index)


def ran_before_settled(original: dict[str, Any], retry: dict[str, Any], cut: int) -> bool:
    """Whether the retry planned or ran call ``cut`` before ``tool.reconciled``
    settled the earlier turn's (or with none settling it)."""
    settled = [
        e["seq"]
        for e in original["events"]
        if e["type"] == EventType.TOOL_RECONCILED and _of_call(e, cut)
    ]
    kinds = (EventType.TOOL_PLANNED, EventType.TOOL_INTENT, EventType.TOOL_RESULT)
    used = [e["seq"] for e in retry["events"] if e["type"] in kinds and _of_call(e, cut)]
    return bool(used) and (not settled or min(used) < min(settled))


def race_findings(
    original: dict[str, Any], retry: dict[str, Any], cut: int, applied: Mapping[str, int]
) -> tuple[list[str], list[str]]:
    """A RETRY of ``original`` sent while the answer about its call ``cut``
    was held (both turns as GraphQL gives them: ``status``, ``events`` with
    ``seq``, ``toolCalls``; one session, so ``seq`` orders them): where the
    record contradicts the store or itself, and where the retry broke its
    promise. ``applied`` says how many times the store applied each effect key."""
    contradicts: list[str] = []
    broken: list[str] = []
    before = {c["index"]: c for c in original["toolCalls"]}.get(cut) or {}
    old_key, state = before.get("effectKey"), before.get("state")
    old_n = applied.get(old_key or "", 0)
    if state not in (ToolCallState.RECONCILED_APPLIED, ToolCallState.RECONCILED_NOT_APPLIED):
        contradicts.append(f"the earlier call {cut} is {state}, not settled")
    elif verdict(state, old_n) != "agreed":
        contradicts.append(f"the earlier call {cut} is {state}; the store applied its key {old_n}x")
    if ran_before_settled(original, retry, cut):
        contradicts.append(
            f"the retry planned or ran call {cut} before the earlier one was settled"
        )
    for call in retry["toolCalls"]:
        judged = verdict(call["state"], applied.get(call["effectKey"], 0))
        if judged == "contradicted":
            contradicts.append(
                f"the retry's call {call['index']} is {call['state']}; the store applied"
                f" its key {applied.get(call['effectKey'], 0)}x"
            )
        elif judged == "uncertain":
            broken.append(f"the retry's call {call['index']} is of unknown outcome")
    after = {c["index"]: c for c in retry["toolCalls"]}.get(cut) or {}
    new_key = after.get("effectKey")
    total = old_n + (applied.get(new_key or "", 0) if new_key != old_key else 0)
    if total > 1:
        contradicts.append(f"the effect is in the store {total} times")
    elif total == 0:
        broken.append("the effect was lost: neither call's key applied")
    if retry["status"] != TurnStatus.COMPLETED:
        broken.append(f"the retry is {retry['status']}, not COMPLETED")
    return contradicts, broken


def race_verdict(contradicts: list[str], broken: list[str]) -> str:
    if contradicts:
        return "contradicted"
    return "broken" if broken else "agreed"


@dataclass
class Row:
    point: str
    tool: str
    kind: str
    runs: int = 0
    record: Counter[str] = field(default_factory=Counter)
    store: Counter[str] = field(default_factory=Counter)
    verdicts: Counter[str] = field(default_factory=Counter)


def summarize(observations: list[dict[str, Any]], *, runs: int, seconds: float) -> dict[str, Any]:
    rows: dict[tuple[str, str], Row] = {}
    earlier = Counter[str]()
    later = Counter[str]()
    for o in observations:
        row = rows.setdefault((o["point"], o["tool"]), Row(o["point"], o["tool"], o["kind"]))
        row.runs += 1
        cut = int(o.get("cut", CRASHED_CALL))  # the call the kill or the cancel met
        crashed = o["calls"][cut]
        row.record[crashed["record"]] += 1
        row.store[crashed["store"]] += 1
        row.verdicts[crashed["verdict"]] += 1
        for call in o["calls"][:cut]:
            earlier[call["verdict"]] += 1
        for call in o["calls"][cut + 1 :]:
            later[call["verdict"]] += 1
    total = Counter[str]()
    for row in rows.values():
        total.update(row.verdicts)
    total.update(earlier)
    total.update(later)
    return {
        "runsPerPoint": runs,
        "seconds": round(seconds, 1),
        "rows": [
            {
                "point": r.point,
                "tool": r.tool,
                "kind": r.kind,
                "runs": r.runs,
                "record": dict(r.record),
                "store": dict(r.store),
                "agreed": r.verdicts["agreed"],
                "uncertain": r.verdicts["uncertain"],
                "contradicted": r.verdicts["contradicted"],
                "broken": r.verdicts["broken"],
            }
            for r in rows.values()
        ],
        "earlierCalls": dict(earlier),
        "laterCalls": dict(later),  # after the call in flight, in the cancelled turns
        "contradictions": total["contradicted"],
        "broken": total["broken"],
        "observations": observations,
    }
