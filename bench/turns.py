"""What a turn costs the record and how soon it runs, at a fixed rate.

``keyturn serve --workers 2`` (or, with ``--peer``, the REST peer) takes new
keys on 64 sessions from an open loop at ``--rate`` for ``--duration``
seconds (bench/loadgen.py, as row c½ of ``make bench``), then waits for every
turn to end. For each round it prints:

- submitTurn's p50 and p99, from each request's scheduled start;
- a turn's wait to start and its whole run, admission to end, p50 and p99,
  on the database's clock (``started_at`` and ``completed_at`` against
  ``created_at``; Keyturn only: the peer runs nothing);
- per admitted turn, the write-ahead log PostgreSQL wrote (bytes and
  records, from ``pg_stat_wal``; the whole server's, so the database should
  be one nobody else writes to) and the transactions committed in the run's
  database (``pg_stat_database``; every statement in autocommit is one).

With ``--waits`` it also samples what the run's busy backends wait on
(``pg_stat_activity``), every 5 ms: the average number of backends in each
wait, by statement.

python -m bench.turns [--rate 300] [--duration 8] [--rounds 2] [--peer]
                      [--waits] [--setting KEYTURN_NAME=VALUE ...]
                      [--database auto|embedded|URL]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench import loadgen
from bench.admission import drain
from bench.load import classify, submit_request, summarize
from bench.rows import progress
from bench.seed import make_sessions
from bench.servers import database_server, port_of, start_keyturn, start_peer, target_databases
from bench.sizes import parse_args
from keyturn.ops.databases import admin_connect

SESSIONS = 64

_WAL = """
    SELECT w.wal_bytes, w.wal_records, d.xact_commit
    FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()
"""

_RUN_TIMES = """
    SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
               ORDER BY extract(epoch FROM started_at - created_at)) AS waited,
           percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
               ORDER BY extract(epoch FROM completed_at - created_at)) AS ran,
           count(*) FILTER (WHERE status <> 'COMPLETED') AS not_completed
    FROM turns WHERE idempotency_key LIKE $1
"""

_WAITS = """
    SELECT wait_event_type, wait_event, left(regexp_replace(query, '\\s+', ' ', 'g'), 60)
    FROM pg_stat_activity
    WHERE datname = current_database() AND state = 'active' AND wait_event_type IS NOT NULL
      AND pid <> pg_backend_pid()
"""


async def _counters(url: str) -> tuple[float, float, float]:
    conn = await admin_connect(url)
    try:
        row = await conn.fetchrow(_WAL)
    finally:
        await conn.close()
    return float(row["wal_bytes"]), float(row["wal_records"]), float(row["xact_commit"])


async def _sample_waits(url: str, stop: asyncio.Event, seen: Counter[Any]) -> None:
    conn = await admin_connect(url)
    try:
        # Each read its own transaction (autocommit): the activity view as of now.
        while not stop.is_set():
            for row in await conn.fetch(_WAITS):
                seen[tuple(row)] += 1
            seen["samples"] += 1
            await asyncio.sleep(0.005)
    finally:
        await conn.close()


async def _round(
    port: int, url: str, sessions: list[str], mode: str, prefix: str, a: argparse.Namespace
) -> tuple[Any, Counter[Any]]:
    stop, seen = asyncio.Event(), Counter[Any]()
    sampler = asyncio.create_task(_sample_waits(url, stop, seen)) if a.waits else None
    try:
        result = await loadgen.open_loop(
            "127.0.0.1",
            port,
            submit_request(mode, sessions, prefix, 0),
            classify(mode),
            rate=a.rate,
            duration_s=a.duration,
        )
    finally:
        stop.set()
        if sampler is not None:
            await sampler
    return summarize(result), seen


async def _run_times(url: str, prefix: str) -> Any:
    conn = await admin_connect(url)
    try:
        return await conn.fetchrow(_RUN_TIMES, f"{prefix}-%")
    finally:
        await conn.close()


def _ms(pair: list[float] | None) -> str:
    if not pair or pair[0] is None:
        return "-"
    return f"{pair[0] * 1000:.1f} / {pair[1] * 1000:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.turns", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=300.0, help="submissions per second")
    p.add_argument("--duration", type=float, default=8.0, help="seconds per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--peer", action="store_true", help="the REST peer instead of Keyturn")
    p.add_argument("--waits", action="store_true", help="sample the backends' waits")
    p.add_argument("--database", default="auto", help="auto, embedded or a server URL")
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEYTURN_NAME=VALUE",
        help="a setting of the server's (repeatable), to compare one value with another",
    )
    a = p.parse_args(argv)
    if any(not item.startswith("KEYTURN_") or "=" not in item for item in a.setting):
        p.error("--setting takes KEYTURN_NAME=VALUE")
    settings = dict(item.split("=", 1) for item in a.setting)
    cfg = parse_args(["--workers", "2", "--database", a.database])
    mode, target = ("rest", "peer") if a.peer else ("graphql", "keyturn")
    with (
        database_server(cfg.database) as (admin_url, where),
        target_databases(admin_url, (target,)) as urls,
        tempfile.TemporaryDirectory(prefix="keyturn-turns-") as tmp,
    ):
        url = urls[target]
        progress(f"{where}; {SESSIONS} sessions, {a.rate:.0f} submissions/s, {target}")
        sessions = asyncio.run(make_sessions(url, SESSIONS, cfg.history))
        if a.peer:
            server = start_peer(cfg, url, Path(tmp))
        else:
            server, _ = start_keyturn(cfg, url, Path(tmp), settings)
        try:
            port = port_of(server)
            for n in range(a.rounds):
                prefix = f"turns{n}"
                before = asyncio.run(_counters(url))
                measured, seen = asyncio.run(_round(port, url, sessions, mode, prefix, a))
                if not a.peer:
                    drain(url, 30)
                after = asyncio.run(_counters(url))
                admitted = max(1, measured["answers"].get("accepted", 0))
                wal, records, commits = (
                    (x - y) / admitted for x, y in zip(after, before, strict=True)
                )
                line = (
                    f"round {n + 1}: submitTurn p50 {measured['p50_ms']:.1f} ms,"
                    f" p99 {measured['p99_ms']:.1f} ms ({admitted} admitted);"
                    f" per turn {wal:,.0f} bytes and {records:.1f} records of WAL,"
                    f" {commits:.1f} transactions"
                )
                if not a.peer:
                    times = asyncio.run(_run_times(url, prefix))
                    line += (
                        f"; admission to start {_ms(times['waited'])},"
                        f" to end {_ms(times['ran'])} (p50 / p99)"
                    )
                    if times["not_completed"]:
                        line += f"; {times['not_completed']} not completed"
                progress(line)
                samples = seen.pop("samples", 0)
                for (kind, event, query), count in seen.most_common(6):
                    print(f"    {count / samples:6.3f} backends waiting on {kind}:{event}  {query}")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
