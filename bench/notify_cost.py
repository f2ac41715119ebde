"""What PostgreSQL NOTIFY costs admission, measured three ways in one run.

    python -m bench.notify_cost [--url URL] [--clients 8] [--seconds 5]

- none:     the admission statement alone (bench/common.py: Keyturn's, as the
            floor and the peer run it; nobody is woken);
- inside:   the same statement with pg_notify() in it, so every admitting
            transaction takes the global notify lock at commit;
- keyturn:  the statement alone, then a wake-up queued for Keyturn's listener
            connection, which sends coalesced NOTIFYs after commit (what
            Keyturn does).

Prints admissions per second for each and the ratios to "none". Uses its own
throwaway database on the server it is given (default: an embedded one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid

import asyncpg

from bench.common import ADMIT
from keyturn.db.engine import asyncpg_dsn
from keyturn.db.listener import Listener
from keyturn.ops.databases import admin_connect, embedded_server, migrate, throwaway

SESSIONS = 64
_RESULT = "SELECT ins.id, ins.status, ins.admit_seq FROM ins, ev"


def _sql(notify: bool) -> str:
    if not notify:
        return ADMIT
    assert _RESULT in ADMIT
    return ADMIT.replace(
        _RESULT,
        ", n AS (SELECT pg_notify('keyturn_events', CAST(ins.session_id AS text)) FROM ins)\n"
        f"{_RESULT}, n",
    )


async def _run(
    dsn: str,
    mode: str,
    clients: int,
    seconds: float,
    sessions: list[uuid.UUID],
    listener: Listener | None,
) -> float:
    sql = _sql(notify=mode == "inside")
    run = uuid.uuid4().hex[:8]
    pool = await asyncpg.create_pool(dsn, min_size=clients, max_size=clients)
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(i: int) -> None:
        nonlocal done
        async with pool.acquire() as conn:
            stmt = await conn.prepare(sql)
            n = 0
            while time.perf_counter() < deadline:
                sid = sessions[(i * 7919 + n) % len(sessions)]
                row = await stmt.fetchrow(
                    sid, f"{run}-{i}-{n}", uuid.uuid4(), "fp", "hello", "FULL"
                )
                assert row is not None
                if listener is not None:
                    listener.wake(sid)
                n += 1
            done += n

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - start
    await pool.close()
    return done / elapsed


async def main_async(url: str, clients: int, seconds: float) -> dict[str, float]:
    async with throwaway(url, prefix="keyturn_notify") as db_url:
        await migrate(db_url)
        dsn = asyncpg_dsn(db_url)
        conn = await admin_connect(db_url)
        sessions = [uuid.uuid4() for _ in range(SESSIONS)]
        await conn.executemany(
            "INSERT INTO sessions (id, default_history) VALUES ($1, 'FULL')",
            [(s,) for s in sessions],
        )
        # A listening connection, so notifications have somewhere to go.
        await conn.add_listener("keyturn_events", lambda *a: None)
        listener = Listener(dsn, on_wake=lambda _s: None, on_reconnect=lambda: None)
        await listener.start()
        rates: dict[str, float] = {}
        for mode in ("none", "inside", "keyturn", "none"):  # "none" twice: drift check
            print(f"  measuring {mode} ({seconds:.0f} s, {clients} clients)…", flush=True)
            rate = await _run(
                dsn, mode, clients, seconds, sessions, listener if mode == "keyturn" else None
            )
            rates[mode] = max(rate, rates.get(mode, 0.0)) if mode == "none" else rate
        await listener.stop()
        await conn.close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=None, help="a PostgreSQL server (default: embedded)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url: str = args.url or stack.enter_context(embedded_server(prefix="keyturn-notify-"))
        rates = asyncio.run(main_async(url, args.clients, args.seconds))
    base = rates["none"]
    print(f"{'mode':<10}{'admissions/s':>14}{'vs none':>10}")
    for mode in ("none", "inside", "keyturn"):
        print(f"{mode:<10}{rates[mode]:>14.0f}{rates[mode] / base:>10.2f}")


if __name__ == "__main__":
    main()
