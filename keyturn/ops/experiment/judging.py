"""Judging the interruption experiment: each call's record beside the store.

agreed        the record says the effect happened (COMPLETED, RECONCILED_APPLIED)
              and the store has it once, or says it did not (NOT_STARTED,
              RECONCILED_NOT_APPLIED) and the store has nothing
uncertain     the record says OUTCOME_UNKNOWN: it claims nothing
contradicted  anything else
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
    if state == ToolCallState.OUTCOME_UNKNOWN:
        return "uncertain" if applied <= 1 else "contradicted"
    if state in HAPPENED:
        return "agreed" if applied == 1 else "contradicted"
    # NOT_STARTED, RECONCILED_NOT_APPLIED, or no record of the call at all
    return "agreed" if applied == 0 else "contradicted"


@dataclass
class Row:
    point: str
    kind: str
    runs: int = 0
    record: Counter[str] = field(default_factory=Counter)
    store: Counter[str] = field(default_factory=Counter)
    verdicts: Counter[str] = field(default_factory=Counter)


def summarize(observations: list[dict[str, Any]], *, runs: int, seconds: float) -> dict[str, Any]:
    rows: dict[tuple[str, str], Row] = {}
    earlier = Counter[str]()
    for o in observations:
        row = rows.setdefault((o["point"], o["kind"]), Row(o["point"], o["kind"]))
        row.runs += 1
        crashed = o["calls"][CRASHED_CALL]
        row.record[crashed["record"]] += 1
        n = crashed["storeApplied"]
        row.store["not applied" if n == 0 else "applied once" if n == 1 else f"applied {n}x"] += 1
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
