"""Row s: what streamed output costs. Events and write transactions per turn
for a reply in one piece and for streamed ones, and submitTurn throughput
while the worker runs plain turns, then streaming ones.

One ``keyturn serve`` per measurement, each on a fresh database of one
PostgreSQL. Write transactions are counted by the transaction ids the server
hands out (only a transaction that writes gets one), so the cluster must be
this run's alone: the default is an embedded PostgreSQL started for the run.
The count covers admission, claim, each delta, lease renewals and the finish.

python -m bench.streaming [--turns 64] [--duration 10] [--concurrency 32]
                          [--database embedded|URL] [--out PATH]
prints the rows and, with --out, writes them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench import loadgen
from bench.load import SUBMIT, classify, summarize
from bench.rows import Measured, progress
from bench.servers import START_TIMEOUT_S, database_server, port_of
from keyturn.ops.databases import admin_connect, migrate, throwaway_database
from keyturn.ops.serverproc import start_server

# A reply in one piece; 8 pieces 25 ms apart (coalesced: about one delta per
# 100 ms flush interval); 8 pieces 150 ms apart (a delta each).
INPUTS = {
    "one piece": "hello",
    "/stream 8 25": "/stream 8 25 hello",
    "/stream 8 150": "/stream 8 150 hello",
}
# No idle polling to count: claims come from wake-ups, the bus from NOTIFY.
QUIET = {"KEYTURN_CLAIM_POLL_S": "60", "KEYTURN_SUBSCRIPTION_POLL_S": "60"}


async def _sessions(url: str, n: int) -> list[str]:
    conn = await admin_connect(url)
    try:
        # An autovacuum ANALYZE would take transaction ids of its own.
        for table in ("sessions", "turns", "events"):
            await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
        rows = await conn.fetch(
            "INSERT INTO sessions (id, default_history, tenant) "
            "SELECT gen_random_uuid(), 'NONE', '' FROM generate_series(1, $1) RETURNING id",
            n,
        )
    finally:
        await conn.close()
    return [str(r["id"]) for r in rows]


async def _xid(url: str) -> int:
    """The next transaction id (reading it takes one)."""
    conn = await admin_connect(url)
    try:
        return int(await conn.fetchval("SELECT txid_current()"))
    finally:
        await conn.close()


async def _unfinished(url: str) -> int:
    conn = await admin_connect(url)
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM turns WHERE status IN ('QUEUED', 'RUNNING')")
        )
    finally:
        await conn.close()


async def _events_per_turn(url: str) -> dict[str, float]:
    conn = await admin_connect(url)
    try:
        turns = int(await conn.fetchval("SELECT count(*) FROM turns"))
        rows = await conn.fetch("SELECT type, count(*) AS n FROM events GROUP BY type")
    finally:
        await conn.close()
    return {r["type"]: r["n"] / turns for r in rows}


def _request(sessions: list[str], prefix: str, text: str) -> loadgen.MakeRequest:
    def make(n: int) -> loadgen.Request:
        body = {
            "query": SUBMIT,
            "variables": {
                "i": {
                    "sessionId": sessions[n % len(sessions)],
                    "idempotencyKey": f"{prefix}-{n}",
                    "input": text,
                }
            },
        }
        return ("POST", "/graphql", {"Content-Type": "application/json"}, orjson.dumps(body))

    return make


def _submit(port: int, make: loadgen.MakeRequest, concurrency: int, seconds: float) -> Measured:
    result = asyncio.run(
        loadgen.closed_loop(
            "127.0.0.1",
            port,
            make,
            classify("graphql"),
            concurrency=concurrency,
            duration_s=seconds,
        )
    )
    return summarize(result)


async def _submit_each(port: int, sessions: list[str], text: str, turns: int) -> None:
    """``turns`` submissions, one per session at a time, so no turn waits in
    a session's queue behind another."""
    make = _request(sessions, "cost", text)
    conn = loadgen.Connection("127.0.0.1", port)
    try:
        for n in range(turns):
            status, body = await conn.request(make(n))
            assert status == 200 and b"TurnAccepted" in body, body
    finally:
        conn.close()


def _cost(admin_url: str, name: str, text: str, turns: int, tmp: Path) -> dict[str, Any]:
    with throwaway_database(admin_url, prefix="keyturn_bench_streaming") as url:
        asyncio.run(migrate(url))
        sessions = asyncio.run(_sessions(url, turns))
        server = start_server(url, tmp, env=QUIET, name="keyturn", timeout=START_TIMEOUT_S)
        try:
            before = asyncio.run(_xid(url))
            asyncio.run(_submit_each(port_of(server), sessions, text, turns))
            while asyncio.run(_unfinished(url)):
                time.sleep(0.2)
            # Two reads of the counter take ids of their own: the probe above
            # and this one; the polls of _unfinished write nothing.
            after = asyncio.run(_xid(url))
        finally:
            server.stop()
        events = asyncio.run(_events_per_turn(url))
    return {
        "input": name,
        "turns": turns,
        "events_per_turn": sum(events.values()),
        "deltas_per_turn": events.get("turn.delta", 0.0),
        "write_transactions_per_turn": (after - before - 1) / turns,
    }


def _throughput(
    admin_url: str, name: str, text: str, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    with throwaway_database(admin_url, prefix="keyturn_bench_streaming") as url:
        asyncio.run(migrate(url))
        sessions = asyncio.run(_sessions(url, 64))
        server = start_server(url, tmp, env={}, name="keyturn", timeout=START_TIMEOUT_S)
        try:
            port = port_of(server)
            _submit(port, _request(sessions, "warm", text), args.concurrency, 2.0)
            measured = _submit(port, _request(sessions, "s", text), args.concurrency, args.duration)
        finally:
            server.stop()
    return {"input": name, **measured}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with (
        database_server(args.database) as (admin_url, where),
        tempfile.TemporaryDirectory(prefix="keyturn-bench-streaming-") as tmp,
    ):
        progress(f"database: {where}")
        cost = []
        for name, text in INPUTS.items():
            progress(f"s  cost of {args.turns} turns: {name}")
            cost.append(_cost(admin_url, name, text, args.turns, Path(tmp)))
        throughput = []
        for name in ("one piece", "/stream 8 25"):
            progress(f"s  submitTurn for {args.duration:.0f}s while the worker runs: {name}")
            throughput.append(_throughput(admin_url, name, INPUTS[name], args, Path(tmp)))
    return {
        "row": "s",
        "label": "streamed output: events and write transactions per turn; submitTurn rate",
        "database": where,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "cost": cost,
        "throughput": throughput,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.streaming", description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=64, help="turns counted per input")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per throughput window")
    p.add_argument("--concurrency", type=int, default=32, help="connections of the load")
    p.add_argument("--database", default="embedded", help="embedded (default) or a URL")
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    row = measure(args)
    for c in row["cost"]:
        print(
            f"s  {c['input']:<14} {c['events_per_turn']:.2f} events/turn "
            f"({c['deltas_per_turn']:.2f} turn.delta), "
            f"{c['write_transactions_per_turn']:.2f} write transactions/turn"
        )
    for t in row["throughput"]:
        print(
            f"s  submitTurn, worker running {t['input']:<14} {t['throughput']:.0f}/s "
            f"(p50 {t['p50_ms']:.1f} ms, p99 {t['p99_ms']:.1f} ms)"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(row, indent=2) + "\n")
        print(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
