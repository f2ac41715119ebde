"""The WAL one retention batch writes, with and without its bound on events.

A backlog of long streamed turns (``--events`` events each) is pruned twice,
each time in a fresh copy of the same backlog: once bounded by turns alone
(``--batch`` turns a batch, the sweeper before its bound on events), once
also by ``--batch-events`` (KEYTURN_RETENTION_BATCH_EVENTS). Each batch runs
as the sweeper runs it, one statement in one transaction, and its WAL is
``pg_current_wal_lsn()`` after its commit less before its start: the
cluster's WAL, so other writers on the same server add to it (``--database
embedded`` has the server to itself).

python -m bench.retention_wal [--turns 40] [--events 2000] [--batch 200]
                              [--batch-events 20000] [--database auto|embedded|URL]
prints, for each way, the batches with their turns, events and WAL.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass

from bench.servers import database_server
from keyturn.db import retention
from keyturn.db.engine import connect, create_engine
from keyturn.ops.databases import admin_connect, migrate, throwaway_database

# One session per turn, its events a stream: turn.started, then deltas, then
# turn.completed, all ended three days ago.
_SEED = """
WITH s AS (
    INSERT INTO sessions (id, default_history, tenant, event_seq)
    SELECT gen_random_uuid(), 'NONE', '', $2 FROM generate_series(1, $1)
    RETURNING id
), t AS (
    INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history, status,
                       output, admit_seq, created_at, started_at, completed_at, epoch)
    SELECT gen_random_uuid(), s.id, 'old', 'fp', 'input', 'NONE', 'COMPLETED', 'output', 1,
           now() - interval '3 days', now() - interval '3 days',
           now() - interval '3 days' + make_interval(secs => row_number() OVER ()), 1
    FROM s
    RETURNING id, session_id
), sk AS (
    INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
    SELECT session_id, 'old', 'TURN', id FROM t
)
INSERT INTO events (session_id, turn_id, seq, type, data)
SELECT t.session_id, t.id, k,
       CASE WHEN k = 1 THEN 'turn.started' WHEN k = $2 THEN 'turn.completed'
            ELSE 'turn.delta' END,
       CASE WHEN k IN (1, $2) THEN jsonb_build_object('epoch', 1)
            ELSE jsonb_build_object('epoch', 1, 'index', k, 'delta', repeat('x', 40)) END
FROM t, generate_series(1, $2) k
"""


@dataclass(frozen=True, slots=True)
class Batch:
    turns: int
    events: int
    wal_bytes: int


async def _prune(url: str, args: argparse.Namespace, batch_events: int) -> list[Batch]:
    await migrate(url)
    admin = await admin_connect(url)
    try:
        await admin.execute(_SEED, args.turns, args.events)
        await admin.execute("ANALYZE")
    finally:
        await admin.close()
    engine = create_engine(url, pool_size=1)
    batches: list[Batch] = []
    try:
        while True:
            async with connect(engine) as conn:
                before = await conn.driver.fetchval("SELECT pg_current_wal_lsn()")
                async with conn.driver.transaction():
                    done = await retention.prune_turns(
                        conn,
                        turn_retention_s=86_400,
                        key_retention_s=3_600,
                        batch=args.batch,
                        batch_events=batch_events,
                    )
                wal = await conn.driver.fetchval(
                    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)", before
                )
            if not done.candidates:
                return batches
            batches.append(Batch(done.turns, done.events, int(wal)))
    finally:
        await engine.dispose()


def _show(name: str, batches: list[Batch]) -> None:
    most = max(b.wal_bytes for b in batches)
    print(
        f"{name}: {len(batches)} batches, at most {max(b.events for b in batches)} events "
        f"and {most / 1e6:.1f} MB of WAL in one"
    )
    for n, b in enumerate(batches):
        print(f"  batch {n}: {b.turns} turns, {b.events} events, {b.wal_bytes / 1e6:.2f} MB WAL")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.retention_wal", description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=40, help="ended turns in the backlog")
    p.add_argument("--events", type=int, default=2000, help="events of each turn")
    p.add_argument("--batch", type=int, default=200, help="KEYTURN_RETENTION_BATCH")
    p.add_argument(
        "--batch-events", type=int, default=20_000, help="KEYTURN_RETENTION_BATCH_EVENTS"
    )
    p.add_argument("--database", default="auto", help="auto, embedded, or a URL")
    args = p.parse_args(argv)
    unbounded = args.turns * args.events + 1  # no bound on events: turns alone
    with database_server(args.database) as (admin_url, where):
        print(f"database: {where}; {args.turns} turns of {args.events} events each")
        for name, bound in (
            (f"bounded by turns alone ({args.batch} a batch)", unbounded),
            (f"also by events ({args.batch_events} a batch)", args.batch_events),
        ):
            with throwaway_database(admin_url, prefix="keyturn_bench_wal") as url:
                _show(name, asyncio.run(_prune(url, args, bound)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
