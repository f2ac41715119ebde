"""Judging the interruption experiment: each call's record beside the store.

agreed        the record says the effect happened (COMPLETED, RECONCILED_APPLIED)
              and the store has it once, or says it did not (NOT_STARTED,
              RECONCILED_NOT_APPLIED) and the store has nothing
uncertain     the record says OUTCOME_UNKNOWN: it claims nothing
contradicted  anything else

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
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from keyturn.domain import ToolCallState

HAPPENED = {ToolCallState.COMPLETED, ToolCallState.RECONCILED_APPLIED}
DID_NOT = {ToolCallState.NOT_STARTED, ToolCallState.RECONCILED_NOT_APPLIED}
CRASHED_CALL = 1  # the second (and last) call of each turn


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
    for o in observations:
        row = rows.setdefault((o["point"], o["tool"]), Row(o["point"], o["tool"], o["kind"]))
        row.runs += 1
        crashed = o["calls"][CRASHED_CALL]
        row.record[crashed["record"]] += 1
        row.store[crashed["store"]] += 1
        row.verdicts[crashed["verdict"]] += 1
        for call in o["calls"][:CRASHED_CALL]:
            earlier[call["verdict"]] += 1
    total = Counter[str]()
    for row in rows.values():
        total.update(row.verdicts)
    total.update(earlier)
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
            }
            for r in rows.values()
        ],
        "earlierCalls": dict(earlier),
        "contradictions": total["contradicted"],
        "observations": observations,
    }
