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
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from keyturn.runtime.auth import create_token
from tests import figures
from tests.support import GraphQLClient, fast_settings, new_key, serve_in_process

UNAVAILABLE = {"code": "UNAVAILABLE", "retryable": True}


@contextlib.asynccontextmanager
async def every_connection_of(engine: AsyncEngine) -> AsyncIterator[None]:
    """Hold all the pool's connections, as a flood of slow requests would."""
    pool: Any = engine.pool
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(pool.size()):
            await stack.enter_async_context(engine.connect())
        assert pool.checkedout() == pool.size()
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
