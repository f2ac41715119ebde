"""The floor: the admission writes issued directly through asyncpg from one process.

Each operation computes the fingerprint, then runs the one admission statement
(lock the session row, claim the key, insert the turn, bump the seq, append
``turn.started``) as its own transaction, and waits for the commit. No HTTP,
no parsing, no lookup before the write: the cheapest way to make the same
durable record, so the ratio to it says what everything else costs.

python -m bench.floor --dsn DSN --sessions FILE --history NONE --duration 10 --concurrency 64
prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

from bench.common import ADMIT, fingerprint

T = TypeVar("T")


async def _no_reset(_conn: asyncpg.Connection) -> None:
    return None


async def run(args: argparse.Namespace, sessions: list[uuid.UUID]) -> dict[str, object]:
    pool = await asyncpg.create_pool(
        args.dsn, min_size=args.pool, max_size=args.pool, reset=_no_reset
    )
    latencies: list[float] = []
    counts = {"accepted": 0, "other": 0}
    counter = iter(range(1 << 62))
    deadline = time.perf_counter() + args.duration

    async def worker() -> None:
        while time.perf_counter() < deadline:
            n = next(counter)
            sid = sessions[n % len(sessions)]
            key = f"{args.prefix}-{n}"
            text = f"hello {n}"
            start = time.perf_counter()
            fp = fingerprint(input=text, history=args.history)
            async with pool.acquire() as conn:
                row = await conn.fetchrow(ADMIT, sid, key, uuid.uuid4(), fp, text, args.history)
            latencies.append((time.perf_counter() - start) * 1000)
            counts["accepted" if row is not None else "other"] += 1

    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - start
    finally:
        await pool.close()
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, round(q / 100 * (len(latencies) - 1)))]

    return {
        "requests": len(latencies),
        "elapsed_s": elapsed,
        "throughput": len(latencies) / elapsed,
        "p50_ms": pct(50),
        "p99_ms": pct(99),
        **counts,
    }


def _run_loop(main: Coroutine[Any, Any, T]) -> T:
    """On uvloop, as uvicorn runs Keyturn and the peer."""
    try:
        from uvloop import run
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        return asyncio.run(main)
    return run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--sessions", required=True, help="file of session ids, one a line")
    parser.add_argument("--history", default="NONE", help="the sessions' default history")
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--pool", type=int, default=20)
    parser.add_argument("--prefix", default="floor")
    args = parser.parse_args()
    sessions = [uuid.UUID(x) for x in Path(args.sessions).read_text().split()]
    json.dump(_run_loop(run(args, sessions)), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
