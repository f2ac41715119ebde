"""What a run reports: the ratios between rows, the targets, the printed
table, and the result written as JSON and drawn as a PNG (bench/chart.py)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path
from typing import NotRequired, TypedDict

import orjson

from bench.fanout import Fanout
from bench.profile import Profile
from bench.rows import Row
from bench.sizes import ROOT, Config
from bench.targets import RUN, Verdict, judge, line

# The rows in the order of the table (and of the JSON).
ORDER = [
    "a.many", "a.hot", "b.many", "b.hot", "b'.many", "b'.hot", "c.many", "c.hot",
    "d.many", "d.hot", "c½", "e", "f", "f'",
]  # fmt: skip


class Meta(TypedDict):
    date: str
    commit: str
    smoke: bool
    database: str
    cores: int | None
    python: str
    client: str
    concurrency: int
    sessions: int
    workers: int
    pool_size: int
    floor_pool: int
    duration_s: float
    history: str
    elapsed_s: float
    summary: str


class RowOut(TypedDict):
    id: str
    label: str
    scope: str
    throughput: float | None
    p50_ms: float | None
    p99_ms: float | None
    detail: dict[str, object]


Ratios = dict[str, dict[str, float | None]]  # scope → ratio name → value


class Result(TypedDict):
    meta: Meta
    rows: list[RowOut]
    ratios: Ratios
    targets: list[Verdict]
    extra: dict[str, object]
    profile_c: NotRequired[Profile]


def ratio(x: Row | None, y: Row | None) -> float | None:
    if x is None or y is None or not x.throughput or not y.throughput:
        return None
    return x.throughput / y.throughput


def ratios(rows: dict[str, Row]) -> Ratios:
    return {
        scope: {
            "c/a": ratio(rows.get(f"c.{scope}"), rows.get(f"a.{scope}")),
            "c/b": ratio(rows.get(f"c.{scope}"), rows.get(f"b.{scope}")),
            "d/c": ratio(rows.get(f"d.{scope}"), rows.get(f"c.{scope}")),
            "d/b'": ratio(rows.get(f"d.{scope}"), rows.get(f"b'.{scope}")),
            "b'/b": ratio(rows.get(f"b'.{scope}"), rows.get(f"b.{scope}")),
        }
        for scope in ("many", "hot")
    }


def targets(rows: dict[str, Row], fan: Fanout | None, *, smoke: bool) -> list[Verdict]:
    """Every target of :data:`bench.targets.RUN`, judged (in a smoke run,
    marked as not judged: its sizes are too small to mean anything)."""
    measured: dict[str, float | None] = {
        "c/b": ratio(rows.get("c.many"), rows.get("b.many")),
        "d/b'": ratio(rows.get("d.many"), rows.get("b'.many")),
        "f/f'": ratio(rows.get("f"), rows.get("f'")),
        "c_half_p99": rows["c½"].p99_ms if "c½" in rows else None,
        "fanout_p99": fan["p99_ms"] if fan else None,
        "sub_kib": fan["kib_per_idle_subscription"] if fan else None,
        "c/a": ratio(rows.get("c.many"), rows.get("a.many")),
        "d/c": ratio(rows.get("d.many"), rows.get("c.many")),
        "page_p50": rows["f"].p50_ms if "f" in rows else None,
    }
    return [judge(t, measured[t.key], smoke=smoke) for t in RUN]


def meta(cfg: Config, database: str, client: str, elapsed_s: float) -> Meta:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return {
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "commit": commit,
        "smoke": cfg.smoke,
        "database": database,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "client": client,
        "concurrency": cfg.concurrency,
        "sessions": cfg.sessions,
        "workers": cfg.workers,
        "pool_size": cfg.pool_size,
        "floor_pool": cfg.floor_pool,
        "duration_s": cfg.duration,
        "history": cfg.history,
        "elapsed_s": round(elapsed_s, 1),
        "summary": (
            f"{os.cpu_count()} cores, {cfg.concurrency} connections, "
            f"{cfg.workers} server processes, pool {cfg.pool_size}, "
            f"{cfg.duration:g}s per row"
        ),
    }


def result(
    run_meta: Meta, rows: dict[str, Row], fan: Fanout | None, extra: dict[str, object]
) -> Result:
    return {
        "meta": run_meta,
        "rows": [
            {
                "id": k,
                "label": rows[k].label,
                "scope": rows[k].scope,
                "throughput": rows[k].throughput,
                "p50_ms": rows[k].p50_ms,
                "p99_ms": rows[k].p99_ms,
                "detail": rows[k].detail,
            }
            for k in ORDER
            if k in rows
        ],
        "ratios": ratios(rows),
        "targets": targets(rows, fan, smoke=run_meta["smoke"]),
        "extra": extra,
    }


def print_table(result: Result) -> None:
    print()
    print(f"Keyturn benchmark — {result['meta']['database']}, {result['meta']['summary']}")
    print()
    head = f"{'row':<4} {'scope':<12} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}  what"
    print(head)
    print("-" * len(head) + "-" * 50)
    for r in result["rows"]:
        t = f"{r['throughput']:9.0f}" if r["throughput"] is not None else " " * 9
        p50 = f"{r['p50_ms']:8.1f}" if r["p50_ms"] is not None else " " * 8
        p99 = f"{r['p99_ms']:8.1f}" if r["p99_ms"] is not None else " " * 8
        print(f"{r['id'].split('.')[0]:<4} {r['scope']:<12} {t} {p50} {p99}  {r['label']}")
    print()
    many_label = f"{result['meta']['sessions']} sessions"
    print(f"ratios (throughput)    {many_label:>13}   hot session")
    for key in ("c/a", "c/b", "d/c", "d/b'"):
        many = result["ratios"]["many"].get(key)
        hot = result["ratios"]["hot"].get(key)
        fm = f"{many:11.2f}" if many is not None else " " * 11
        fh = f"{hot:13.2f}" if hot is not None else " " * 13
        print(f"  {key:<22} {fm}   {fh}")
    print()
    print("targets (measured, must reach, goal)")
    for verdict in result["targets"]:
        print(line(verdict))
    print()


def write_json(result: Result, path: Path) -> None:
    options = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
    path.write_bytes(orjson.dumps(result, option=options) + b"\n")
