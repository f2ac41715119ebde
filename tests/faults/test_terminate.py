"""``pg_terminate_backend`` on each of the service's connections in turn (pool,
listener) while turns run and a subscriber watches: no partial event batch,
no stuck turn, no stuck listener."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from tests import figures
from tests.faults.load import Load
from tests.support import (
    SESSION_EVENTS,
    GraphQLClient,
    admin,
    fast_settings,
    request,
    serve_in_process,
    ws_session,
)

pytestmark = pytest.mark.slow

# What a turn's own events may be, in order, for each status it ends in.
ENDINGS = {"COMPLETED": "turn.completed", "FAILED": "turn.failed"}


async def keyturn_backends(conn: Any) -> list[tuple[int, str]]:
    rows = await conn.fetch(
        """SELECT pid, application_name FROM pg_stat_activity
           WHERE datname = current_database() AND pid <> pg_backend_pid()
             AND application_name LIKE 'keyturn%' ORDER BY pid"""
    )
    return [(r["pid"], r["application_name"]) for r in rows]


async def test_terminating_each_connection_in_turn_leaves_nothing_partial_or_stuck(
    database_url: str,
) -> None:
    conn = await admin(database_url)
    # A: admits and runs turns. B: only watches, with its safety-net poll
    # far away, so what it sees live comes through its listener.
    async with (
        serve_in_process(database_url, fast_settings(pool_size=3)) as a,
        serve_in_process(
            database_url, fast_settings(pool_size=2, subscription_poll_s=60, claim_poll_s=60)
        ) as b,
    ):
        client = GraphQLClient(a.url)
        sid = await client.create_session()
        seen: list[int] = []

        async def watch() -> None:
            async with ws_session(b.ws_url) as ws:
                async for item in ws.subscribe(request(SESSION_EVENTS, s=sid, a=0)):
                    seen.append(item["sessionEvents"]["seq"])

        watcher = asyncio.create_task(watch())
        # Paced so the session's queue stays short: turns are running (a
        # 50 ms model) whenever a connection is cut, and all end soon after.
        load = Load(a.url, sid, text="/sleep 50 x", pace_s=0.3)
        workers = [asyncio.create_task(load.worker(n)) for n in range(3)]
        terminated: dict[str, int] = {}
        try:
            await load.acks_after(0, 3)
            listeners_before = (
                a.app.state.runtime.listener.reconnects,
                b.app.state.runtime.listener.reconnects,
            )
            done: set[int] = set()
            deadline = time.monotonic() + 12
            while time.monotonic() < deadline and len(done) < 40:
                backends = [p for p in await keyturn_backends(conn) if p[0] not in done]
                if not backends:
                    await asyncio.sleep(0.1)
                    continue
                # Every fourth a listener, else the oldest pooled connection.
                want_listener = len(done) % 4 == 0
                backends.sort(
                    key=lambda p: (p[1].startswith("keyturn-listener") != want_listener, p[0])
                )
                pid, name = backends[0]
                if await conn.fetchval("SELECT pg_terminate_backend($1)", pid):
                    done.add(pid)
                    kind = "listener" if name.startswith("keyturn-listener") else "pool"
                    terminated[kind] = terminated.get(kind, 0) + 1
                    figures.add("faults injected")
                    figures.add(f"faults: pg_terminate_backend ({kind})")
                await asyncio.sleep(0.25)
            load.stop.set()
            await asyncio.wait_for(asyncio.gather(*workers), 30)
        finally:
            load.stop.set()
            for w in workers:
                w.cancel()
        assert terminated.get("listener", 0) >= 2 and terminated.get("pool", 0) >= 5, terminated

        # No stuck turn: every turn ends, and as it should have.
        deadline = time.monotonic() + 20
        while await conn.fetchval(
            "SELECT count(*) FROM turns WHERE status IN ('QUEUED', 'RUNNING')"
        ):
            if time.monotonic() > deadline:
                stuck = await conn.fetch(
                    """SELECT t.id, t.status, t.owner, t.epoch, t.lease_until - now() AS left,
                              array_agg(e.type ORDER BY e.seq) AS events
                       FROM turns t JOIN events e ON e.turn_id = t.id
                       WHERE t.status IN ('QUEUED', 'RUNNING') GROUP BY t.id"""
                )
                raise AssertionError(f"{len(stuck)} turns stuck: {[dict(r) for r in stuck[:5]]}")
            await asyncio.sleep(0.1)
        turns = await conn.fetch("SELECT id, status, idempotency_key FROM turns")
        assert {t["status"] for t in turns} <= {"COMPLETED"}, {t["status"] for t in turns}
        # No partial event batch: each turn's events are whole, one ending,
        # and the session's counter matches the last event.
        for t in turns:
            types = [
                r["type"]
                for r in await conn.fetch(
                    "SELECT type FROM events WHERE turn_id = $1 ORDER BY seq", t["id"]
                )
            ]
            assert types[0] == "turn.started" and types[-1] == ENDINGS[t["status"]], types
            assert types.count("turn.started") == 1 and types.count(types[-1]) == 1, types
        seqs = [r["seq"] for r in await conn.fetch("SELECT seq FROM events ORDER BY seq")]
        assert seqs == list(range(1, len(seqs) + 1))
        assert await conn.fetchval("SELECT event_seq FROM sessions") == len(seqs)
        lost = [
            k for k, tid in load.acked.items() if k not in {t["idempotency_key"] for t in turns}
        ]
        figures.add("turns lost", len(lost))
        assert not lost and len(turns) == len(load.acked)
        figures.add("turns acknowledged under faults", len(load.acked))

        # No stuck listener: both reconnected, and B's subscriber (no poll for
        # a minute) got every event, live, within moments of the last one.
        reconnects = (
            a.app.state.runtime.listener.reconnects,
            b.app.state.runtime.listener.reconnects,
        )
        assert reconnects[0] > listeners_before[0] and reconnects[1] > listeners_before[1]
        deadline = time.monotonic() + 10
        while seen[-1:] != seqs[-1:]:
            if time.monotonic() > deadline:
                why = watcher.exception() if watcher.done() else "still subscribed"
                raise AssertionError(f"subscriber stuck at {seen[-1:]} of {seqs[-1]}: {why!r}")
            await asyncio.sleep(0.05)
        assert seen == seqs  # in order, no gap, no duplicate
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        await client.close()
    await conn.close()
    print(
        f"terminated {terminated}; answers {dict(load.answers)}; listener reconnects {reconnects}"
    )
