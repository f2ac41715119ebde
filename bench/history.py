"""Row h: turns of a session that already holds 10,000 turns, as a ratio to
the same turns of a new session (the target is at least 0.8).

Every turn of a FULL-history session reads its earlier turns before it runs;
KEYTURN_HISTORY_MAX_TURNS bounds that read, so a turn's cost should not grow
with the session. One ``keyturn serve`` runs the same number of turns, first
in a new session, then in one seeded straight into the record with 10,000
completed turns; a session runs one turn at a time, so the row is the rate
at which one session's turns complete, submitted as fast as they are taken.
It also reports the server's memory after each part.

python -m bench.history [--turns 200] [--history 10000] [--database auto|embedded|URL]
                        [--out PATH]
prints the row and, with --out, writes it as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.rows import progress
from bench.seed import seed_backlog
from bench.servers import START_TIMEOUT_S, database_server
from bench.targets import RATIO_FLOOR, judge, ratio_target
from keyturn.ops.databases import admin_connect, migrate, throwaway_database
from keyturn.ops.serverproc import ServerProcess, start_server

TARGET = ratio_target("h", "turns of a 10,000-turn session / of a new one")
_SUBMIT = """mutation($i: SubmitTurnInput!) { submitTurn(input: $i) { __typename } }"""


async def _prepare(url: str, history: int) -> tuple[str, str, str]:
    """A session of ``history`` completed FULL-history turns, a new one, and
    one to warm the server up with."""
    await migrate(url)
    conn = await admin_connect(url)
    try:
        await seed_backlog(conn, sessions=1, turns_per_session=history, ended_ago=timedelta(days=1))
        long = str(await conn.fetchval("SELECT id FROM sessions"))
        new, warm = str(uuid.uuid4()), str(uuid.uuid4())
        for sid in (new, warm):
            await conn.execute(
                "INSERT INTO sessions (id, default_history) VALUES ($1::uuid, 'FULL')", sid
            )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()
    return long, new, warm


async def _run_turns(
    server: ServerProcess, url: str, session_id: str, turns: int, prefix: str
) -> float:
    """Submit ``turns`` turns to one session and wait for all to complete;
    turns completed per second, from the first submission to the last end."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        sem = asyncio.Semaphore(16)

        async def submit(n: int) -> None:
            variables = {
                "i": {
                    "sessionId": session_id,
                    "idempotencyKey": f"{prefix}-{n}",
                    "input": f"turn {n}",
                }
            }
            async with sem:
                answer = await http.post(
                    "/graphql", json={"query": _SUBMIT, "variables": variables}
                )
            kind = answer.json()["data"]["submitTurn"]["__typename"]
            if kind != "TurnAccepted":
                raise RuntimeError(f"turn {n}: {kind}")

        await asyncio.gather(*(submit(n) for n in range(turns)))
    conn = await admin_connect(url)
    try:
        left = turns
        while left:
            await asyncio.sleep(0.05)
            left = await conn.fetchval(
                "SELECT count(*) FROM turns WHERE session_id = $1::uuid "
                "AND idempotency_key LIKE $2 AND status <> 'COMPLETED'",
                session_id,
                f"{prefix}-%",
            )
    finally:
        await conn.close()
    return turns / (time.monotonic() - started)


def _rss_mib(server: ServerProcess) -> float:
    return float(psutil.Process(server.proc.pid).memory_info().rss) / 2**20


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with (
        database_server(args.database) as (admin_url, where),
        throwaway_database(admin_url, prefix="keyturn_bench_history") as url,
        tempfile.TemporaryDirectory(prefix="keyturn-bench-history-") as tmp,
    ):
        progress(f"database: {where}; seeding a session of {args.history} turns")
        long, new, warm = asyncio.run(_prepare(url, args.history))
        env = {"KEYTURN_LOG_LEVEL": "warning"}
        server = start_server(url, Path(tmp), env=env, name="keyturn", timeout=START_TIMEOUT_S)
        try:
            progress("warm-up")
            asyncio.run(_run_turns(server, url, warm, args.turns, "warm"))
            progress(f"h- {args.turns} turns in a new session")
            fresh = asyncio.run(_run_turns(server, url, new, args.turns, "new"))
            fresh_rss = _rss_mib(server)
            progress(f"h  {args.turns} turns in a session of {args.history} turns")
            grown = asyncio.run(_run_turns(server, url, long, args.turns, "long"))
            grown_rss = _rss_mib(server)
        finally:
            server.stop()
    ratio = grown / fresh if fresh else 0.0
    return {
        "row": "h",
        "label": f"turns of a {args.history}-turn FULL-history session (ratio to a new one)",
        "database": where,
        "turns": args.turns,
        "history_turns": args.history,
        "new_session_turns_per_s": fresh,
        "long_session_turns_per_s": grown,
        "rss_mib_after_new": fresh_rss,
        "rss_mib_after_long": grown_rss,
        "ratio": ratio,
        "target": RATIO_FLOOR,
        "verdict": judge(TARGET, ratio),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.history", description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=200, help="turns run in each session")
    p.add_argument("--history", type=int, default=10_000, help="turns the long session holds")
    p.add_argument("--database", default="auto", help="auto, embedded, or a URL")
    p.add_argument("--out", type=Path, default=None, help="write the row as JSON here")
    args = p.parse_args(argv)
    row = measure(args)
    print(
        f"h  {row['new_session_turns_per_s']:.0f} turns/s in a new session, "
        f"{row['long_session_turns_per_s']:.0f}/s in one of {row['history_turns']} turns: "
        f"ratio {row['ratio']:.2f} (must >= {RATIO_FLOOR}: {row['verdict']['verdict']}); server "
        f"{row['rss_mib_after_new']:.0f} → {row['rss_mib_after_long']:.0f} MiB"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(row, indent=2) + "\n")
        print(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
