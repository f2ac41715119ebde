"""PostgreSQL restarted under load: the service recovers by itself, submissions
in flight get a retryable error, retries converge, nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import httpx
import pytest

from keyturn.db.engine import asyncpg_dsn
from tests import figures
from tests.faults.load import Load
from tests.faults.pg import PrivatePostgres
from tests.support import GraphQLClient, fast_settings, serve_in_process

pytestmark = pytest.mark.slow

QUERY_SESSION = "query($id: ID!) { session(id: $id) { eventCount } }"


async def check_record(url: str, load: Load) -> None:
    conn: Any = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch("SELECT id::text, idempotency_key, status FROM turns")
        by_key = {r["idempotency_key"]: r["id"] for r in rows}
        lost = [k for k, tid in load.acked.items() if by_key.get(k) != tid]
        figures.add("turns acknowledged under faults", len(load.acked))
        figures.add("turns lost", len(lost))
        assert not lost, f"acknowledged turns missing: {lost[:5]}"
        # One turn per key, and nothing the client never got an answer for.
        assert len(rows) == len(load.acked)
        bad = await conn.fetch(
            """SELECT t.id FROM turns t
               WHERE NOT EXISTS (SELECT 1 FROM events e
                                 WHERE e.turn_id = t.id AND e.type = 'turn.started')"""
        )
        assert not bad, "a turn without its turn.started event"
        gaps = await conn.fetchval(
            """SELECT count(*) FROM (
                 SELECT seq, lag(seq) OVER (PARTITION BY session_id ORDER BY seq) AS prev
                 FROM events) x WHERE prev IS NOT NULL AND seq <> prev + 1"""
        )
        assert gaps == 0
    finally:
        await conn.close()


async def wait_all_ended(url: str, within: float = 30) -> None:
    conn: Any = await asyncpg.connect(asyncpg_dsn(url))
    try:
        deadline = time.monotonic() + within
        while True:
            open_ = await conn.fetchval(
                "SELECT count(*) FROM turns WHERE status IN ('QUEUED', 'RUNNING')"
            )
            if open_ == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{open_} turns stuck after the restarts")
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def test_restarts_fast_and_immediate_lose_nothing_and_recover_by_themselves(
    private_pg: PrivatePostgres, fault_db: str
) -> None:
    async with serve_in_process(fault_db, fast_settings(pool_size=4)) as srv:
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        load = Load(srv.url, sid)
        workers = [asyncio.create_task(load.worker(n)) for n in range(6)]
        try:
            await load.acks_after(0, 20)
            recoveries = []
            errors_once_back = 0
            for mode in ("fast", "immediate", "fast", "immediate"):
                await asyncio.to_thread(private_pg.restart, mode)
                figures.add("faults injected")
                figures.add(f"faults: pg_ctl restart -m {mode}")
                restarted = time.monotonic()
                await load.acks_after(restarted, 20)
                errors_once_back += sum(1 for t in load.error_times if t > restarted)
                recoveries.append(load.last_ack - restarted)
            load.stop.set()
            await asyncio.wait_for(asyncio.gather(*workers), 30)
        finally:
            load.stop.set()
            for w in workers:
                w.cancel()
        # The process recovered by itself: healthy, listening, running turns.
        async with httpx.AsyncClient(base_url=srv.url) as http:
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/readyz")).status_code == 200
        runtime = srv.app.state.runtime
        # Listening again: the listener's last attempts may have landed while
        # the server was still starting; it retries at least once a second.
        async with asyncio.timeout(10):
            while not (runtime.listener.reconnects and runtime.listener.connected.is_set()):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        await wait_all_ended(fault_db)
        await check_record(fault_db, load)
        after = await client.submit(sid, "after-restarts", "still here")
        assert after["__typename"] == "TurnAccepted"
        await client.wait_for_status(after["turn"]["id"], {"COMPLETED"})
        await client.close()
    figures.add("submissions retried after a retryable error", load.retries)
    print(
        f"restart answers: {dict(load.answers)}; retries {load.retries}; "
        f"errors once the server was back: {errors_once_back}; "
        f"first ack after each restart: {[round(r, 2) for r in recoveries]} s"
    )


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_after_a_restart_while_idle_the_first_requests_succeed(
    private_pg: PrivatePostgres, fault_db: str, mode: str
) -> None:
    """Pooled connections died with the old server; nobody used them since.
    The next requests must not be the ones to find out (slow polls here, so
    that no background task finds out first)."""
    settings = fast_settings(pool_size=4, claim_poll_s=30, subscription_poll_s=30)
    async with serve_in_process(fault_db, settings) as srv:
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        # Fill the pool with connections that will all be dead.
        warm = await asyncio.gather(*(client.submit(sid, f"w{i}", "warm") for i in range(8)))
        for w in warm:
            await client.wait_for_status(w["turn"]["id"], {"COMPLETED"})
        await asyncio.to_thread(private_pg.restart, mode)
        figures.add("faults injected")
        figures.add(f"faults: pg_ctl restart -m {mode}")
        await asyncio.sleep(0.5)  # idle for a moment
        answers = await asyncio.gather(*(client.raw(QUERY_SESSION, {"id": sid}) for _ in range(8)))
        errors = [a["errors"] for a in answers if a.get("errors")]
        assert not errors, errors
        result = await client.submit(sid, "after", "after an idle restart")
        assert result["__typename"] == "TurnAccepted"
        await client.close()
