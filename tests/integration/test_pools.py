"""The process's two pools: requests that take every connection of theirs
neither hold up the worker nor get anything but a clear, retryable answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import REGISTRY
from sqlalchemy.engine import make_url
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from keyturn.db.engine import Engine, connect, create_engine
from keyturn.errors import DatabaseBusy
from keyturn.runtime.auth import create_token
from tests import figures
from tests.support import GraphQLClient, fast_settings, new_key, serve_in_process

UNAVAILABLE = {"code": "UNAVAILABLE", "retryable": True}


@contextlib.asynccontextmanager
async def every_connection_of(engine: Engine) -> AsyncIterator[None]:
    """Hold all the pool's connections, as a flood of slow requests would."""
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(engine.size()):
            await stack.enter_async_context(connect(engine))
        assert engine.checkedout() == engine.size()
        yield


async def test_a_running_turn_outlives_its_lease_while_requests_hold_every_connection(
    database_url: str, db: Any
) -> None:
    settings = fast_settings(pool_size=3, pool_timeout_s=1.0, work_pool_size=5)
    async with serve_in_process(database_url, settings) as server:
        client = GraphQLClient(server.url)
        try:
            sid = await client.create_session()
            # Longer than the lease (3 s): it completes only if it is renewed.
            admitted = await client.submit(sid, new_key(), "/sleep 4500")
            turn_id = admitted["turn"]["id"]
            await client.wait_for_status(turn_id, {"RUNNING"})

            async with every_connection_of(server.app.state.runtime.engine):
                deadline = time.monotonic() + 20
                status = "RUNNING"
                while status == "RUNNING" and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                    status = await db.fetchval(
                        "SELECT status FROM turns WHERE id = $1::uuid", turn_id
                    )
                figures.add("other tenants' turns interrupted", int(status == "INTERRUPTED"))
                assert status == "COMPLETED"

            turn = await client.turn(turn_id)
            assert turn is not None
            types = [e["type"] for e in turn["events"]]
            assert types == ["turn.started", "turn.running", "turn.delta", "turn.completed"]

            metrics = (await client.http.get("/metrics")).text
            assert "keyturn_work_pool_connections_size 5.0" in metrics
            assert "keyturn_work_pool_connections_in_use" in metrics
        finally:
            await client.close()


async def test_an_exhausted_pool_answers_unavailable_not_a_masked_error(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = fast_settings(pool_size=2, pool_timeout_s=0.5)
    async with serve_in_process(database_url, settings) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            with caplog.at_level(logging.INFO):
                async with every_connection_of(server.app.state.runtime.engine):
                    response = await http.post(
                        "/graphql",
                        json={"query": f'{{ session(id: "{uuid.uuid4()}") {{ id }} }}'},
                    )
            body = response.json()
            assert body["errors"][0]["extensions"] == UNAVAILABLE, body
            assert "Unexpected error." not in response.text
            assert "busy" in body["errors"][0]["message"], body
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
            # Once connections are back, the same request answers.
            again = await http.post(
                "/graphql", json={"query": f'{{ session(id: "{uuid.uuid4()}") {{ id }} }}'}
            )
            assert again.json() == {"data": {"session": None}}


async def test_the_token_check_answers_503_when_the_pool_is_exhausted(
    database_url: str, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings = fast_settings(pool_size=2, pool_timeout_s=0.5, auth_recheck_s=0.1)
    async with serve_in_process(database_url, settings) as server:
        engine = server.app.state.runtime.engine
        token = await create_token(engine, name="alice")
        headers = {"authorization": f"Bearer {token}"}
        query = {"query": "mutation { createSession { id } }"}
        async with httpx.AsyncClient(base_url=server.url, timeout=10, headers=headers) as http:
            assert (await http.post("/graphql", json=query)).status_code == 200
            await asyncio.sleep(0.3)  # past the token cache: the check asks the database
            with caplog.at_level(logging.INFO):
                async with every_connection_of(engine):
                    response = await http.post("/graphql", json=query)
            assert response.status_code == 503, response.text
            assert response.json()["errors"][0]["extensions"] == UNAVAILABLE
            assert response.headers["retry-after"]
            assert await db.fetchval("SELECT count(*) FROM sessions") == 1  # the first one only
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@contextlib.asynccontextmanager
async def events_locked(db: Any) -> AsyncIterator[None]:
    """Every statement that touches the events table waits until the end."""
    transaction = db.transaction()
    await transaction.start()
    try:
        await db.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        yield
    finally:
        await transaction.rollback()


@pytest.mark.parametrize("setting", ["statement_timeout", "lock_timeout"])
async def test_statement_and_lock_timeouts_answer_unavailable(
    database_url: str, db: Any, caplog: pytest.LogCaptureFixture, setting: str
) -> None:
    # The operator's timeout, on every connection of the server (libpq's options).
    # (The URL may carry parameters already: the embedded server's socket.)
    url = (
        make_url(database_url)
        .update_query_dict({"options": f"-c {setting}=300"})
        .render_as_string(hide_password=False)
    )
    async with serve_in_process(url, fast_settings()) as server:
        client = GraphQLClient(server.url)
        try:
            sid = await client.create_session()
            read = {
                "query": "query($id: ID!) { session(id: $id) { events(first: 1) { totalCount } } }",
                "variables": {"id": sid},
            }
            with caplog.at_level(logging.INFO):
                async with events_locked(db):
                    # A read (SQLSTATE 57014 or 55P03 past the timeout) and a
                    # write, whose turn.started event waits for the same lock.
                    answer = await client.http.post("/graphql", json=read)
                    submitted = await client.raw(
                        "mutation($i: SubmitTurnInput!) { submitTurn(input: $i) { __typename } }",
                        {"i": {"sessionId": sid, "idempotencyKey": "k1", "input": "hello"}},
                    )
            for body in (answer.json(), submitted):
                assert body.get("data") in (None, {"session": None}, {"submitTurn": None}), body
                [error] = body["errors"]
                assert error["extensions"] == UNAVAILABLE, body
                assert "busy" in error["message"], body
            assert "Unexpected error." not in answer.text
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
            assert "SELECT" not in caplog.text and "INSERT" not in caplog.text, caplog.text
            # Nothing of the refused submission was written; once the lock is
            # gone the same requests answer.
            assert await db.fetchval("SELECT count(*) FROM turns") == 0
            again = await client.http.post("/graphql", json=read)
            assert again.json() == {"data": {"session": {"events": {"totalCount": 0}}}}
            admitted = await client.submit(sid, "k1", "hello")
            assert admitted["__typename"] == "TurnAccepted", admitted
        finally:
            await client.close()


async def test_a_cancel_keyturn_issues_is_not_taken_for_a_busy_database(database_url: str) -> None:
    engine = create_engine(database_url, pool_size=1, pool_timeout=5)
    try:
        started = asyncio.Event()
        pids: list[int] = []

        async def sleeper() -> None:
            async with connect(engine) as conn:
                pids.append(await conn.driver.fetchval("SELECT pg_backend_pid()"))
                started.set()
                await conn.driver.execute("SELECT pg_sleep(30)")

        task = asyncio.create_task(sleeper())
        await started.wait()
        await asyncio.sleep(0.2)  # the statement is running on the server
        task.cancel()
        # The server answers asyncpg's cancel with 57014; the task sees its own
        # cancellation, never DatabaseBusy.
        with pytest.raises(asyncio.CancelledError):
            await task
        # And the cancel reaches no later statement: the connection it left in
        # an unknown state was dropped, and the pool's one slot has a new one.
        for _ in range(3):
            async with connect(engine) as conn:
                assert await conn.driver.fetchval("SELECT 1") == 1
                assert await conn.driver.fetchval("SELECT pg_backend_pid()") != pids[0]
    finally:
        await engine.dispose()


async def test_the_websocket_token_check_answers_try_again_later_when_the_pool_is_exhausted(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = fast_settings(pool_size=2, pool_timeout_s=0.5, auth_recheck_s=0.1)
    async with serve_in_process(database_url, settings) as server:
        engine = server.app.state.runtime.engine
        token = await create_token(engine, name="alice")

        async def connection_init() -> tuple[int | None, str]:
            async with ws_connect(
                server.ws_url,
                subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
            ) as ws:
                await ws.send(
                    orjson.dumps(
                        {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
                    ).decode()
                )
                try:
                    message = await asyncio.wait_for(ws.recv(), 10)
                except ConnectionClosed as closed:
                    assert closed.rcvd is not None, "the connection was dropped, not closed"
                    return closed.rcvd.code, closed.rcvd.reason
                return None, str(message)

        assert (await connection_init())[1] == '{"type":"connection_ack"}'
        await asyncio.sleep(0.3)  # past the token cache: the check asks the database
        with caplog.at_level(logging.INFO):
            async with every_connection_of(engine):
                code, reason = await connection_init()
        # 1013 Try Again Later (RFC 6455's registry): the service, not the
        # token, is the problem, and graphql-ws clients reconnect on it.
        assert code == 1013, (code, reason)
        assert "busy" in reason and "retry" in reason, reason
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
        # Once connections are back, the same token is acknowledged.
        assert (await connection_init())[1] == '{"type":"connection_ack"}'


async def test_the_requests_pool_keeps_its_plans_and_the_workers_lets_postgresql_choose(
    database_url: str,
) -> None:
    """The requests' statements keep one generic plan per connection (not
    planned anew on every call); the worker's claim is planned as
    PostgreSQL's default chooses (keyturn.db.engine.REQUEST_SETTINGS)."""
    async with serve_in_process(database_url, fast_settings()) as server:
        runtime = server.app.state.runtime
        async with connect(runtime.engine) as conn:
            requests = await conn.driver.fetchval("SHOW plan_cache_mode")
        async with connect(runtime.work_engine) as conn:
            worker = await conn.driver.fetchval("SHOW plan_cache_mode")
    assert (requests, worker) == ("force_generic_plan", "auto")


async def test_a_connection_goes_back_to_the_pool_as_it_came_whichever_way_it_is_returned(
    database_url: str,
) -> None:
    """A checkout that finds an idle open connection takes it without a
    timer, and one returned outside a transaction goes back without a task;
    both must still be the pool's ordinary checkout and return: the same
    backend reused, nothing left checked out, a transaction left open rolled
    back, a connection the server closed replaced, and the pool's timeout
    kept when every connection is out."""
    engine = create_engine(database_url, pool_size=2, pool_timeout=0.3)
    try:
        async with connect(engine) as conn:
            first = await conn.driver.fetchval("SELECT pg_backend_pid()")
        for _ in range(3):
            async with connect(engine) as conn:
                assert await conn.driver.fetchval("SELECT pg_backend_pid()") == first
            assert engine.checkedout() == 0

        # A transaction left open: rolled back on the way in, not seen by the next.
        async with connect(engine) as conn:
            await conn.driver.execute("BEGIN")
            await conn.driver.execute("CREATE TEMP TABLE left_open (x int)")
        async with connect(engine) as conn:
            assert not conn.driver.is_in_transaction()
            assert await conn.driver.fetchval("SELECT to_regclass('pg_temp.left_open')") is None

        # The server ends an idle connection: the checkout that draws it
        # gets a new backend, not the dead one.
        async with connect(engine) as a, connect(engine) as b:
            pids = {await c.driver.fetchval("SELECT pg_backend_pid()") for c in (a, b)}
        async with connect(engine) as keeper:
            kept = await keeper.driver.fetchval("SELECT pg_backend_pid()")
            (victim,) = pids - {kept}
            assert await keeper.driver.fetchval("SELECT pg_terminate_backend($1)", victim)
            gone = "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)"
            for _ in range(200):
                if await keeper.driver.fetchval(gone, victim):
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # for the closed socket to reach the driver
            async with connect(engine) as conn:
                assert await conn.driver.fetchval("SELECT pg_backend_pid()") not in pids

        # Every connection out: a checkout waits for one to come back (on a
        # pool whose timeout is far away), and past the timeout it is busy.
        patient = create_engine(database_url, pool_size=1, pool_timeout=60)
        try:
            async with connect(patient) as held:
                out = await held.driver.fetchval("SELECT pg_backend_pid()")

                async def checkout() -> int:
                    async with connect(patient) as conn:
                        return int(await conn.driver.fetchval("SELECT pg_backend_pid()"))

                waiting = asyncio.create_task(checkout())
                for _ in range(20):
                    await asyncio.sleep(0)
                assert not waiting.done() and patient.checkedout() == 1
                assert patient.waiting() == 1
            assert await waiting == out and patient.checkedout() == 0
            assert patient.waiting() == 0
        finally:
            await patient.dispose()
        async with connect(engine), connect(engine):
            with pytest.raises(DatabaseBusy):
                async with connect(engine):
                    pass
        assert engine.checkedout() == 0
        async with connect(engine) as conn:
            assert await conn.driver.fetchval("SELECT 1") == 1
    finally:
        await engine.dispose()


async def test_checkouts_that_wait_for_a_connection_get_one_in_the_order_they_came(
    database_url: str,
) -> None:
    """A checkout that arrives while others wait goes behind them, even when
    it comes in the very moment a connection is handed back: under load,
    one that kept being overtaken waited ten times as long as the rest."""
    engine = create_engine(database_url, pool_size=2, pool_timeout=30)
    served: list[str] = []
    holding: list[None] = []
    both_held, handed_back = asyncio.Event(), asyncio.Event()

    async def checkout(name: str) -> None:
        async with connect(engine) as conn:
            served.append(name)
            await conn.driver.fetchval("SELECT 1")

    async def holder() -> None:
        async with connect(engine):
            holding.append(None)
            if len(holding) == 2:
                both_held.set()
            await handed_back.wait()

    try:
        async with every_connection_of(engine):
            pass  # both connections open and idle: a newcomer would find one at once
        holders = [asyncio.create_task(holder()) for _ in range(2)]
        await asyncio.wait_for(both_held.wait(), 10)
        waiting = []
        for n in range(6):
            waiting.append(asyncio.create_task(checkout(f"waiting {n}")))
            await asyncio.sleep(0)  # each begins to wait before the next arrives
        # The holders give their connections back, and in the same moment
        # newcomers arrive: they run before the waiters the returns woke.
        handed_back.set()
        newcomers = [asyncio.create_task(checkout(f"newcomer {n}")) for n in range(4)]
        await asyncio.wait_for(asyncio.gather(*holders, *waiting, *newcomers), 30)
        assert served == [f"waiting {n}" for n in range(6)] + [f"newcomer {n}" for n in range(4)]
        assert engine.checkedout() == 0
    finally:
        await engine.dispose()


async def test_metrics_count_the_requests_waiting_for_a_connection(database_url: str) -> None:
    # The requests wait far longer than the gauges take to show them.
    settings = fast_settings(pool_size=2, pool_timeout_s=60.0)
    async with serve_in_process(database_url, settings) as server:
        engine = server.app.state.runtime.engine
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
            query = {"query": f'{{ session(id: "{uuid.uuid4()}") {{ id }} }}'}
            async with every_connection_of(engine):
                requests = [
                    asyncio.create_task(http.post("/graphql", json=query)) for _ in range(3)
                ]
                # The gauges are sampled once a second (as /metrics reports
                # them, whichever process answers).
                seen = None
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    seen = REGISTRY.get_sample_value("keyturn_pool_checkouts_waiting")
                    if seen == 3.0:
                        break
                    await asyncio.sleep(0.02)
                assert seen == 3.0 and engine.waiting() == 3
                assert REGISTRY.get_sample_value("keyturn_pool_connections_in_use") == 2.0
                assert REGISTRY.get_sample_value("keyturn_work_pool_checkouts_waiting") == 0.0
            for answered in await asyncio.gather(*requests):
                assert answered.json() == {"data": {"session": None}}
            assert engine.waiting() == 0
            metrics = (await http.get("/metrics")).text
            assert "keyturn_pool_checkouts_waiting 0.0" in metrics, metrics
            assert "keyturn_work_pool_checkouts_waiting 0.0" in metrics
