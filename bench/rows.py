"""A row of the table, what each measurement becomes, and the progress line
printed as each row is measured."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict


class Measured(TypedDict):
    """A throughput row as a load client reports it."""

    requests: int
    throughput: float
    p50_ms: float
    p99_ms: float
    max_ms: NotRequired[float]  # the floor reports none
    answers: dict[str, int]  # how many answers of each kind (accepted, replayed, …)


@dataclass
class Row:
    id: str
    label: str
    scope: str
    throughput: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    detail: dict[str, object] = field(default_factory=dict)


def progress(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", flush=True)


def row_from(rid: str, label: str, scope: str, m: Measured, **detail: object) -> Row:
    d: dict[str, object] = {
        k: v for k, v in m.items() if k not in ("throughput", "p50_ms", "p99_ms")
    }
    d.update(detail)
    return Row(rid, label, scope, m["throughput"], m["p50_ms"], m["p99_ms"], d)


def show(row: Row) -> None:
    tput = f"{row.throughput:8.0f}/s" if row.throughput is not None else "         "
    p50 = f"{row.p50_ms:7.1f}" if row.p50_ms is not None else "       "
    p99 = f"{row.p99_ms:7.1f}" if row.p99_ms is not None else "       "
    progress(f"  {row.id:<3} {row.scope:<12} {tput}  p50 {p50} ms  p99 {p99} ms  {row.label}")
