"""What the suite exercised, printed at the end of the run."""

from __future__ import annotations

import collections
from typing import Any

FIGURES: collections.Counter[str] = collections.Counter()
# The largest value seen of a measured effect, with its unit.
WORST: dict[str, tuple[float, str]] = {}
# Always printed, even when zero: the figures the suite promises.
PROMISED = (
    "faults injected",
    "turns acknowledged under faults",
    "turns lost",
    "commit answers cut",
    "contradictions found",
    "attack queries tried",
    "other tenants' turns interrupted",
    "soak turns acknowledged",
    "soak turns missing",
    "fuzz inputs tried",
    "fuzz server errors",
)


def add(name: str, amount: int = 1) -> None:
    FIGURES[name] += amount


def worst(name: str, value: float, unit: str) -> None:
    """Keep the largest ``value`` of an effect the suite measured (not asserted)."""
    if name not in WORST or value > WORST[name][0]:
        WORST[name] = (value, unit)


def exported() -> dict[str, Any]:
    """The figures as plain data, to cross from a worker process of a
    parallel run to the one that prints them."""
    return {
        "counts": dict(FIGURES),
        "worst": {name: [value, unit] for name, (value, unit) in WORST.items()},
    }


def merge(exported: dict[str, Any]) -> None:
    """Add another process's figures to these: counts add up, the worst stays the worst."""
    FIGURES.update(exported["counts"])
    for name, (value, unit) in exported["worst"].items():
        worst(name, value, unit)


def summary() -> list[str]:
    names = list(PROMISED) + sorted(n for n in FIGURES if n not in PROMISED)
    lines = [f"{name}: {FIGURES[name]}" for name in names]
    lines += [f"{name}: {value:.1f} {unit}" for name, (value, unit) in sorted(WORST.items())]
    return lines
