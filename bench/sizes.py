"""What a run measures with: the flags of ``python -m bench.run`` and the
sizes they give, full or ``--smoke``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

DESCRIPTION = (
    "``make bench``: Keyturn beside its floor and a REST peer, in one run, on one PostgreSQL."
)


@dataclass
class Config:
    duration: float
    warmup: float
    concurrency: int
    sessions: int
    workers: int
    pool_size: int
    floor_pool: int
    listeners: int
    fanout_turns: int
    fanout_sleep_ms: int
    events: int
    walk_passes: int
    drain_timeout: float
    history: str
    client: str
    database: str
    out: Path
    smoke: bool
    profile: bool


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(prog="bench", description=DESCRIPTION)
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it all runs")
    p.add_argument("--duration", type=float, help="seconds per throughput row (default 10)")
    p.add_argument("--concurrency", type=int, default=64, help="connections for every row")
    p.add_argument("--sessions", type=int, default=64, help="sessions in the 'many' rows")
    p.add_argument("--workers", type=int, default=2, help="server processes (Keyturn and peer)")
    p.add_argument(
        "--pool-size",
        type=int,
        default=20,
        help="connections per server process: KEYTURN_POOL_SIZE, and the peer's pool at most as "
        "many",
    )
    p.add_argument("--floor-pool", type=int, default=20, help="connections the floor uses")
    p.add_argument("--listeners", type=int, help="turnCompleted listeners (default 1000)")
    p.add_argument("--events", type=int, help="events in the reading session (default 10000)")
    p.add_argument(
        "--history", default="NONE", choices=["NONE", "FULL"], help="the sessions' default"
    )
    p.add_argument("--client", default="auto", choices=["auto", "wrk", "python"])
    p.add_argument(
        "--database",
        default="auto",
        help="auto (127.0.0.1:5432 if it answers, else embedded), embedded, or a URL",
    )
    p.add_argument("--out", type=Path, default=BENCH / "results", help="where results go")
    p.add_argument("--profile", action="store_true", help="py-spy Keyturn during row c")
    a = p.parse_args(argv)
    smoke: bool = a.smoke
    return Config(
        duration=a.duration or (1.0 if smoke else 10.0),
        warmup=0.5 if smoke else 2.0,
        concurrency=a.concurrency if not smoke else min(a.concurrency, 8),
        sessions=a.sessions if not smoke else min(a.sessions, 8),
        workers=a.workers,
        pool_size=a.pool_size,
        floor_pool=a.floor_pool if not smoke else min(a.floor_pool, 4),
        listeners=a.listeners or (20 if smoke else 1000),
        fanout_turns=2 if smoke else 10,
        fanout_sleep_ms=2500 if smoke else 4000,
        events=a.events or (1000 if smoke else 10000),
        walk_passes=1 if smoke else 3,
        drain_timeout=5.0 if smoke else 30.0,
        history=a.history,
        client=a.client,
        database=a.database,
        out=a.out,
        smoke=smoke,
        profile=a.profile,
    )
