"""The targets the benchmark is judged by, in one place: each with the value
it must reach and the goal beyond it, and the verdict a measurement gets.

``make bench`` judges its rows by :data:`RUN`; the rows run alone (r, h and
the scale run) each hold a ratio to :data:`RATIO_FLOOR`. Every verdict is
printed as one line and written into the JSON beside the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict

Cmp = Literal[">=", "<="]


@dataclass(frozen=True, slots=True)
class Target:
    key: str
    label: str
    cmp: Cmp
    must: float  # what the measurement must reach
    goal: float  # where it should end up (the same as ``must`` when there is no further goal)
    unit: str

    def reaches(self, value: float, bound: float) -> bool:
        return value >= bound if self.cmp == ">=" else value <= bound


# ``make bench``: the rows of bench/run.py. Ratios are throughputs on 64
# sessions; latencies are p99 in ms.
RUN: tuple[Target, ...] = (
    Target("c/b", "submitTurn new keys / REST peer new keys (64 sessions)", ">=", 0.6, 1.0, "x"),
    Target("d/b'", "replays / the peer's replays (64 sessions)", ">=", 0.5, 1.0, "x"),
    Target("f/f'", "page of 100 events / the peer's page, throughput", ">=", 0.4, 1.0, "x"),
    Target("c_half_p99", "submitTurn p99 at half of peak (c½)", "<=", 25.0, 10.0, "ms"),
    Target("fanout_p99", "fan-out p99, 1,000 listeners on 2 processes", "<=", 100.0, 50.0, "ms"),
    Target("sub_kib", "memory per idle subscription", "<=", 32.0, 16.0, "KiB"),
    # Earlier targets, still held.
    Target("c/a", "submitTurn new keys / floor (64 sessions)", ">=", 0.5, 0.5, "x"),
    Target("d/c", "replays / new keys (64 sessions)", ">=", 1.5, 1.5, "x"),
    Target("page_p50", "one page of 100 events, p50 (one reader)", "<=", 10.0, 10.0, "ms"),
)

# A measurement on a grown record (or under a sweeper) over the same
# measurement without it: rows r and h, and every ratio of the scale run.
RATIO_FLOOR = 0.8


def ratio_target(key: str, label: str) -> Target:
    return Target(key, label, ">=", RATIO_FLOOR, RATIO_FLOOR, "x")


SMOKE_NOTE = "(smoke: sizes too small to judge)"


class Verdict(TypedDict):
    key: str
    label: str
    cmp: str
    must: float
    goal: float
    unit: str
    target: str  # "<cmp> <must> <unit>", as printed
    goal_target: str  # "<cmp> <goal> <unit>"
    measured: float | None
    met: bool | None  # None: nothing was measured
    goal_met: bool | None
    verdict: str  # "goal met", "met", "NOT met" or "n/a"
    judged: bool  # False for a smoke run: its sizes say nothing about the targets


def _bound(cmp: str, value: float, unit: str) -> str:
    return f"{cmp} {value:g} {unit}"


def judge(target: Target, value: float | None, *, smoke: bool = False) -> Verdict:
    met = goal_met = None
    if value is not None and value == value:  # not NaN
        met = target.reaches(value, target.must)
        goal_met = target.reaches(value, target.goal)
    if met is None:
        verdict = "n/a"
    elif goal_met and target.goal != target.must:
        verdict = "goal met"
    else:
        verdict = "met" if met else "NOT met"
    return {
        "key": target.key,
        "label": target.label,
        "cmp": target.cmp,
        "must": target.must,
        "goal": target.goal,
        "unit": target.unit,
        "target": _bound(target.cmp, target.must, target.unit),
        "goal_target": _bound(target.cmp, target.goal, target.unit),
        "measured": value,
        "met": met,
        "goal_met": goal_met,
        "verdict": verdict,
        "judged": not smoke,
    }


def line(v: Verdict, *, width: int = 56) -> str:
    """One printed line: what, measured, must reach, goal, verdict."""
    value = v["measured"]
    shown = "n/a" if value is None or value != value else f"{value:.2f} {v['unit']}"
    goal = f"goal {v['goal_target']}" if v["goal"] != v["must"] else ""
    text = (
        f"  {v['key']:<11} {v['label']:<{width}} {shown:>11}   must {v['target']:<11} "
        f"{goal:<17} {v['verdict']}"
    )
    return f"{text}  {SMOKE_NOTE}" if not v["judged"] else text
