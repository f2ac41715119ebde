"""What the suite exercised, printed at the end of the run."""

from __future__ import annotations

import collections

FIGURES: collections.Counter[str] = collections.Counter()
# Always printed, even when zero: the figures the suite promises.
PROMISED = (
    "faults injected",
    "turns acknowledged under faults",
    "turns lost",
    "fuzz inputs tried",
    "fuzz server errors",
)


def add(name: str, amount: int = 1) -> None:
    FIGURES[name] += amount


def summary() -> list[str]:
    names = list(PROMISED) + sorted(n for n in FIGURES if n not in PROMISED)
    return [f"{name}: {FIGURES[name]}" for name in names]
