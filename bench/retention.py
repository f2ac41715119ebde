"""Row r: Keyturn's submitTurn while the retention sweeper prunes a large
backlog, as a ratio to submitTurn without it (the target is at least 0.8).

``keyturn serve`` (with a key retention, so admission judges expiry as it
would in production) takes new keys from a closed loop, first alone, then
while a sweeper works through a backlog of long-ended turns written straight
into the record: by default the sweeper inside ``keyturn serve`` itself (the
server started again with the turn retention: its own sweeper begins a pass
at once, on its own timer, in the process that admits), with ``--sweeper
prune`` a ``keyturn prune`` beside the server. The backlog is sized so the
sweeper is still busy when the second window closes (the row says whether it
was). By default the load submits to sessions of its own; with ``--load-on
backlog`` it submits to the backlog's sessions, the very rows each batch of
the sweeper locks, so an admission that waits behind a batch shows in the
latency (the row reports p99 and the longest wait).

python -m bench.retention [--duration 10] [--concurrency 32] [--backlog 150000]
                          [--sweeper serve|prune] [--sweep-s 1]
                          [--load-on fresh|backlog]
                          [--database auto|embedded|URL] [--out PATH]
prints the row and, with --out, writes it as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench import loadgen
from bench.load import classify, submit_request, summarize
from bench.rows import Measured, progress
from bench.seed import seed_backlog
from bench.servers import START_TIMEOUT_S, database_server, port_of
from bench.sizes import ROOT
from bench.targets import RATIO_FLOOR, judge, ratio_target
from keyturn.ops.databases import admin_connect, migrate, throwaway_database
from keyturn.ops.serverproc import start_server

RETENTION = {"KEYTURN_KEY_RETENTION": "1h", "KEYTURN_TURN_RETENTION": "1d"}
TURNS_PER_SESSION = 500
TARGET = ratio_target("r", "submitTurn while the sweeper prunes / alone")


async def _prepare(url: str, backlog: int, sessions: int, load_on: str) -> list[str]:
    """Migrate, seed the backlog, and make (or, for ``load_on="backlog"``,
    choose: every session of the backlog) the sessions the load submits to."""
    await migrate(url)
    conn = await admin_connect(url)
    try:
        for _ in range(max(1, backlog // (TURNS_PER_SESSION * 20))):
            await seed_backlog(
                conn,
                sessions=20,
                turns_per_session=TURNS_PER_SESSION,
                ended_ago=timedelta(days=3),
                history="NONE",
            )
        await conn.execute("ANALYZE")
        if load_on == "backlog":
            rows = await conn.fetch("SELECT DISTINCT session_id AS id FROM turns")
            return [str(r["id"]) for r in rows]
        rows = await conn.fetch(
            "INSERT INTO sessions (id, default_history, tenant) "
            "SELECT gen_random_uuid(), 'NONE', '' FROM generate_series(1, $1) RETURNING id",
            sessions,
        )
    finally:
        await conn.close()
    return [str(r["id"]) for r in rows]


async def _count(url: str, sql: str) -> int:
    conn = await admin_connect(url)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def _load(
    port: int, sessions: list[str], prefix: str, concurrency: int, seconds: float
) -> Measured:
    result = asyncio.run(
        loadgen.closed_loop(
            "127.0.0.1",
            port,
            submit_request("graphql", sessions, prefix, 0),
            classify("graphql"),
            concurrency=concurrency,
            duration_s=seconds,
        )
    )
    return summarize(result)


# How many backlog turns are still prunable (the retention is a day).
_PRUNABLE = "SELECT count(*) FROM turns WHERE completed_at < now() - interval '1 day'"


def _prune_command(url: str, batch: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "keyturn", "prune"],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("KEYTURN_")},
            "KEYTURN_DATABASE_URL": url,
            "KEYTURN_RETENTION_BATCH": str(batch),
            **RETENTION,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with (
        database_server(args.database) as (admin_url, where),
        throwaway_database(admin_url, prefix="keyturn_bench_retention") as url,
        tempfile.TemporaryDirectory(prefix="keyturn-bench-retention-") as tmp,
    ):
        progress(f"database: {where}; seeding a backlog of {args.backlog} ended turns")
        sessions = asyncio.run(_prepare(url, args.backlog, args.sessions, args.load_on))
        backlog = asyncio.run(_count(url, "SELECT count(*) FROM turns"))
        env = {
            "KEYTURN_POOL_SIZE": str(args.pool_size),
            "KEYTURN_LOG_LEVEL": "warning",
            "KEYTURN_KEY_RETENTION": RETENTION["KEYTURN_KEY_RETENTION"],
        }
        server = start_server(url, Path(tmp), env=env, name="keyturn", timeout=START_TIMEOUT_S)
        try:
            port = port_of(server)
            progress("warm-up")
            _load(port, sessions, "warm", args.concurrency, 2.0)
            progress(f"r- submitTurn alone, {args.duration:.0f}s")
            alone = _load(port, sessions, "alone", args.concurrency, args.duration)
            if args.sweeper == "serve":
                # The same server again, now with the turn retention: its own
                # sweeper starts a pass at once and prunes on its timer (every
                # KEYTURN_RETENTION_SWEEP_S), inside the process that admits.
                server.stop()
                server = start_server(
                    url,
                    Path(tmp),
                    env={
                        **env,
                        **RETENTION,
                        "KEYTURN_RETENTION_BATCH": str(args.batch),
                        "KEYTURN_RETENTION_SWEEP_S": str(args.sweep_s),
                    },
                    name="keyturn-sweeping",
                    timeout=START_TIMEOUT_S,
                )
                port = port_of(server)
                progress("warm-up, serve's sweeper pruning")
                _load(port, sessions, "warm2", args.concurrency, 2.0)
                sweeper = None
                what = "serve's own sweeper"
            else:
                sweeper = _prune_command(url, args.batch)
                time.sleep(1.0)  # the command's start, before its first batch
                what = "keyturn prune"
            progress(f"r  submitTurn while {what} works, {args.duration:.0f}s")
            try:
                before = asyncio.run(_count(url, "SELECT count(*) FROM key_tombstones"))
                swept = _load(port, sessions, "swept", args.concurrency, args.duration)
                after = asyncio.run(_count(url, "SELECT count(*) FROM key_tombstones"))
                still_busy = asyncio.run(_count(url, _PRUNABLE)) > 0
            finally:
                if sweeper is not None:
                    sweeper.terminate()
                    sweeper.wait(30)
        finally:
            server.stop()
    ratio = swept["throughput"] / alone["throughput"] if alone["throughput"] else 0.0
    return {
        "row": "r",
        "label": "submitTurn while the retention sweeper prunes a backlog (ratio to alone)",
        "database": where,
        "sweeper": args.sweeper,
        "load_on": args.load_on,
        "load_sessions": len(sessions),
        "backlog_turns": backlog,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "batch": args.batch,
        "sweep_interval_s": args.sweep_s if args.sweeper == "serve" else None,
        "alone": alone,
        "with_sweeper": swept,
        "pruned_during_window": after - before,
        "sweeper_busy_whole_window": still_busy and after > before,
        "ratio": ratio,
        "target": RATIO_FLOOR,
        "verdict": judge(TARGET, ratio),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.retention", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=10.0, help="seconds per window")
    p.add_argument("--concurrency", type=int, default=32, help="connections of the load")
    p.add_argument("--sessions", type=int, default=64, help="sessions the load submits to")
    p.add_argument("--backlog", type=int, default=150_000, help="ended turns to prune")
    p.add_argument("--batch", type=int, default=200, help="KEYTURN_RETENTION_BATCH")
    p.add_argument(
        "--sweeper",
        choices=("serve", "prune"),
        default="serve",
        help="who prunes: the sweeper inside keyturn serve (its own timer), or keyturn prune",
    )
    p.add_argument(
        "--sweep-s", type=float, default=1.0, help="KEYTURN_RETENTION_SWEEP_S (--sweeper serve)"
    )
    p.add_argument(
        "--load-on",
        choices=("fresh", "backlog"),
        default="fresh",
        help="submit to new sessions, or to the backlog's (the rows the sweeper locks)",
    )
    p.add_argument("--pool-size", type=int, default=10, help="KEYTURN_POOL_SIZE")
    p.add_argument("--database", default="auto", help="auto, embedded, or a URL")
    p.add_argument("--out", type=Path, default=None, help="write the row as JSON here")
    args = p.parse_args(argv)
    row = measure(args)
    alone, swept = row["alone"], row["with_sweeper"]
    print(
        f"r  submitTurn to {args.load_on} sessions alone {alone['throughput']:.0f}/s "
        f"(p99 {alone['p99_ms']:.1f} ms, max {alone['max_ms']:.0f} ms); "
        f"while pruning {swept['throughput']:.0f}/s "
        f"(p99 {swept['p99_ms']:.1f} ms, max {swept['max_ms']:.0f} ms); "
        f"ratio {row['ratio']:.2f} (must >= {RATIO_FLOOR}: {row['verdict']['verdict']}); "
        f"{row['pruned_during_window']} turns "
        f"pruned in the window, sweeper busy throughout: {row['sweeper_busy_whole_window']}"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(row, indent=2) + "\n")
        print(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
