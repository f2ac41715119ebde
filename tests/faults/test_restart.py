"""PostgreSQL restarted under load: the service recovers by itself, submissions
in flight get a retryable error, retries converge, nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
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


async def intents_recorded(url: str, n: int, within: float = 15) -> None:
    """Wait until ``n`` tool calls have their intents (and are held after them)."""
    conn: Any = await asyncpg.connect(asyncpg_dsn(url))
    try:
        deadline = time.monotonic() + within
        while await conn.fetchval("SELECT count(*) FROM events WHERE type = 'tool.intent'") < n:
            assert time.monotonic() < deadline, "the calls did not reach their intents"
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


CALLS = """
query($id: ID!) { turn(id: $id) {
  status toolCalls { index kind state result } events { type }
} }
"""

# What the README's restart paragraph allows a call in flight to end as, by
# kind: a READ_ONLY call answers or is an error; an IDEMPOTENT one answers, or
# is asked at once whether its key was applied, or stays unknown.
ALLOWED = {
    "READ_ONLY": {"COMPLETED"},
    "IDEMPOTENT": {"COMPLETED", "RECONCILED_APPLIED", "RECONCILED_NOT_APPLIED", "OUTCOME_UNKNOWN"},
}


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_restart_with_tool_calls_in_flight_keeps_their_turns_and_the_store_agrees(
    private_pg: PrivatePostgres, fault_db: str, mode: str, tmp_path: Path
) -> None:
    """A READ_ONLY and an IDEMPOTENT call of the synthetic tools (whose store
    is in the same PostgreSQL) are in flight, held after their intents, when
    the server restarts; they go on once it is back. Their turns keep their
    leases and finish; each call is recorded as the README says, and the
    record agrees with the store."""
    release = tmp_path / "release"
    settings = fast_settings(
        pool_size=4, lease_ttl_s=15.0, hold_at="after_intent:0", hold_until=release
    )
    async with serve_in_process(fault_db, settings) as srv:
        client = GraphQLClient(srv.url)
        read_sid, write_sid = await client.create_session(), await client.create_session()
        read = (await client.submit(read_sid, "r", "/read x"))["turn"]["id"]
        write = (await client.submit(write_sid, "w", "/write a=1"))["turn"]["id"]
        await intents_recorded(fault_db, 2)
        await asyncio.to_thread(private_pg.restart, mode)
        figures.add("faults injected")
        figures.add(f"faults: pg_ctl restart -m {mode} with tool calls in flight")
        release.touch()
        ended = {
            tid: await client.wait_for_status(tid, {"COMPLETED", "INTERRUPTED", "FAILED"}, 30)
            for tid in (read, write)
        }
        turns = {tid: (await client.execute(CALLS, {"id": tid}))["turn"] for tid in ended}
        await client.close()
    applied = await store_rows(fault_db, f"{write}/0")
    for tid, t in turns.items():
        types = [e["type"] for e in t["events"]]
        assert t["status"] == "COMPLETED", (t, ended[tid])
        assert "turn.interrupted" not in types and "turn.write_refused" not in types, types
        [call] = t["toolCalls"]
        assert call["state"] in ALLOWED[call["kind"]], call
        assert types.count("tool.intent") == types.count("tool.result") == 1, types
    [call] = turns[write]["toolCalls"]
    # The record agrees with the store: applied once, or never, as it says.
    if call["state"] in ("COMPLETED", "RECONCILED_APPLIED"):
        assert applied.count(True) == 1, (call, applied)
    elif call["state"] == "RECONCILED_NOT_APPLIED":
        assert True not in applied, (call, applied)
    else:
        assert applied.count(True) <= 1, (call, applied)
    print(f"restart -m {mode} with calls in flight: {[c['toolCalls'] for c in turns.values()]}")


async def store_rows(url: str, effect_key: str) -> list[bool]:
    """Whether each row the synthetic store holds for ``effect_key`` applied it."""
    conn: Any = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch(
            "SELECT applied FROM synthetic_effects WHERE effect_key = $1 ORDER BY id", effect_key
        )
    finally:
        await conn.close()
    return [r["applied"] for r in rows]


async def waiting_on_the_store(url: str, within: float = 15) -> None:
    """Wait until a backend waits for the lock on the synthetic store: the
    tool's own statement is running."""
    conn: Any = await asyncpg.connect(asyncpg_dsn(url))
    try:
        deadline = time.monotonic() + within
        while not await conn.fetchval(
            """SELECT count(*) FROM pg_stat_activity
               WHERE wait_event_type = 'Lock' AND query LIKE '%synthetic_effects%'
                 AND pid <> pg_backend_pid()"""
        ):
            assert time.monotonic() < deadline, "the tool's statement did not start"
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


# One call of each kind whose own statement (the synthetic store is in the
# same PostgreSQL) is running when the server restarts.
IN_STATEMENT = {"READ_ONLY": "/read a", "IDEMPOTENT": "/write a=1", "UNSAFE": "/append a=1"}


@pytest.mark.parametrize("kind", list(IN_STATEMENT))
@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_restart_while_a_tools_own_statement_runs_is_recorded_as_the_readme_says(
    private_pg: PrivatePostgres, fault_db: str, mode: str, kind: str
) -> None:
    """The store's table is locked, so the tool's statement waits in the
    server when it restarts; the restart ends that statement, and the tool
    fails with the database. The call is recorded once the record can be
    written again, as the README's restart paragraph says for its kind; the
    turn goes on and completes; the store holds what the record says."""
    settings = fast_settings(pool_size=4, lease_ttl_s=15.0)
    async with serve_in_process(fault_db, settings) as srv:
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        blocker: Any = await asyncpg.connect(asyncpg_dsn(fault_db))
        try:
            await blocker.execute("BEGIN; LOCK TABLE synthetic_effects IN ACCESS EXCLUSIVE MODE")
            tid = (await client.submit(sid, "t", IN_STATEMENT[kind]))["turn"]["id"]
            await waiting_on_the_store(fault_db)
            # The restart ends the blocker's transaction too: nothing of it lingers.
            await asyncio.to_thread(private_pg.restart, mode)
        finally:
            with contextlib.suppress(Exception):
                await blocker.close(timeout=1)
        figures.add("faults injected")
        figures.add(f"faults: pg_ctl restart -m {mode} during a tool's own statement")
        ended = await client.wait_for_status(tid, {"COMPLETED", "INTERRUPTED", "FAILED"}, 30)
        turn = (await client.execute(CALLS, {"id": tid}))["turn"]
        await client.close()
    applied = await store_rows(fault_db, f"{tid}/0")
    types = [e["type"] for e in turn["events"]]
    assert turn["status"] == "COMPLETED", (turn, ended)
    assert "turn.interrupted" not in types and "turn.write_refused" not in types, types
    assert types.count("tool.intent") == types.count("tool.result") == 1, types
    [call] = turn["toolCalls"]
    assert call["kind"] == kind, call
    # The tool failed with the restart, not otherwise.
    assert "DatabaseUnavailable" in call["result"]["error"], call
    print(f"restart -m {mode} during a {kind} call's statement: {call}; store {applied}")
    if kind == "READ_ONLY":
        # An error, and the call counts as done: a read did nothing.
        assert call["state"] == "COMPLETED" and "error" in call["result"], call
    else:
        # An IDEMPOTENT tool is asked at once whether its key was applied,
        # but its store is the database that is still away: no answer.
        assert call["state"] == "OUTCOME_UNKNOWN" and call["result"]["outcomeUnknown"], call
    # Its statement was waiting for the lock when the restart ended it:
    # nothing applied, and no question settled the key either.
    assert applied == [], applied
