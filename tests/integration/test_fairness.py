"""No tenant starves another: one tenant's flood of legal reads runs at most
its share of a process's connections; another tenant's request still answers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from keyturn.runtime.auth import create_token
from tests import figures
from tests.support import fast_settings, serve_in_process

# A read that holds its connection while the events table is locked.
SLOW_READ = "query($id: ID!) { session(id: $id) { events(first: 1) { totalCount } } }"
QUICK_READ = "query($id: ID!) { session(id: $id) { id } }"


@contextlib.asynccontextmanager
async def events_locked(db: Any) -> AsyncIterator[None]:
    """Every read of events waits, holding its pooled connection, until the end."""
    transaction = db.transaction()
    await transaction.start()
    try:
        await db.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        yield
    finally:
        await transaction.rollback()


async def until_done(tasks: list[asyncio.Task[httpx.Response]], n: int, within: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while sum(t.done() for t in tasks) < n:
        assert loop.time() < deadline, f"{sum(t.done() for t in tasks)} of {n} answered"
        await asyncio.sleep(0.05)


async def test_one_tenants_flood_does_not_starve_another(database_url: str, db: Any) -> None:
    settings = fast_settings(pool_size=4, tenant_max_concurrent=2, pool_timeout_s=1.0)
    async with serve_in_process(database_url, settings) as server:
        engine = server.app.state.runtime.engine
        a_token = await create_token(engine, name="a")
        b_token = await create_token(engine, name="b")
        a = httpx.AsyncClient(
            base_url=server.url, timeout=30, headers={"authorization": f"Bearer {a_token}"}
        )
        b = httpx.AsyncClient(
            base_url=server.url, timeout=30, headers={"authorization": f"Bearer {b_token}"}
        )
        try:
            sessions = []
            for http in (a, b):
                made = await http.post(
                    "/graphql", json={"query": "mutation { createSession { id } }"}
                )
                sessions.append(made.json()["data"]["createSession"]["id"])
            a_session, b_session = sessions

            async with events_locked(db):
                flood = [
                    asyncio.create_task(
                        a.post(
                            "/graphql", json={"query": SLOW_READ, "variables": {"id": a_session}}
                        )
                    )
                    for _ in range(6)
                ]
                # Two run (and hold their connections); the other four wait
                # their turn, briefly, and are turned away.
                await until_done(flood, 4, within=15)
                refused = [t.result() for t in flood if t.done()]
                for response in refused:
                    assert response.status_code == 503, response.text
                    assert response.headers["retry-after"] == "1"
                    assert response.json()["errors"][0]["extensions"] == {
                        "code": "UNAVAILABLE",
                        "retryable": True,
                    }

                # Another tenant, meanwhile: a prompt and correct answer.
                figures.add("attack queries tried", len(flood))
                probe_started = time.monotonic()
                answer = await asyncio.wait_for(
                    b.post("/graphql", json={"query": QUICK_READ, "variables": {"id": b_session}}),
                    5,
                )
                figures.worst(
                    "another tenant's probe under a flood, latency",
                    (time.monotonic() - probe_started) * 1000,
                    "ms",
                )
                assert answer.status_code == 200, answer.text
                assert answer.json() == {"data": {"session": {"id": b_session}}}
                assert sum(not t.done() for t in flood) == 2

            # The two that ran answer once their reads can go on.
            done = await asyncio.wait_for(asyncio.gather(*flood), 15)
            ran = [r for r in done if r.status_code == 200]
            assert len(ran) == 2
            for response in ran:
                assert response.json() == {"data": {"session": {"events": {"totalCount": 0}}}}
        finally:
            await a.aclose()
            await b.aclose()
