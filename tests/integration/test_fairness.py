"""No tenant starves another: one tenant's flood of legal reads runs at most
its share of a process's connections; another tenant's request still answers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import connect as ws_connect

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


@contextlib.asynccontextmanager
async def two_tenants(
    server: Any,
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, str, str, str]]:
    """Tenants a and b of ``server``, each with a client on its token and a
    session: a's client, b's client, a's token, a's session, b's session."""
    engine = server.app.state.runtime.engine
    clients = []
    tokens = []
    for name in ("a", "b"):
        token = await create_token(engine, name=name)
        tokens.append(token)
        clients.append(
            httpx.AsyncClient(
                base_url=server.url, timeout=30, headers={"authorization": f"Bearer {token}"}
            )
        )
    try:
        sessions = []
        for http in clients:
            made = await http.post("/graphql", json={"query": "mutation { createSession { id } }"})
            sessions.append(made.json()["data"]["createSession"]["id"])
        yield clients[0], clients[1], tokens[0], sessions[0], sessions[1]
    finally:
        for http in clients:
            await http.aclose()


async def until_done(tasks: list[asyncio.Task[httpx.Response]], n: int, within: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while sum(t.done() for t in tasks) < n:
        assert loop.time() < deadline, f"{sum(t.done() for t in tasks)} of {n} answered"
        await asyncio.sleep(0.05)


async def test_one_tenants_flood_does_not_starve_another(database_url: str, db: Any) -> None:
    settings = fast_settings(pool_size=4, tenant_max_concurrent=2, pool_timeout_s=1.0)
    async with serve_in_process(database_url, settings) as server:
        async with two_tenants(server) as (a, b, _, a_session, b_session):
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


class Socket:
    """One graphql-transport-ws connection of one tenant, its answers by operation id."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.answers: dict[str, list[dict[str, Any]]] = {}
        self.ended: dict[str, str] = {}  # id → "complete" or "error"
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self.ws:
            message = orjson.loads(raw)
            if "id" in message:
                self.answers.setdefault(message["id"], []).append(message)
                if message["type"] in ("complete", "error"):
                    self.ended[message["id"]] = message["type"]

    async def send(self, id: str, query: str, variables: dict[str, Any]) -> None:
        payload = {"query": query, "variables": variables}
        await self.ws.send(
            orjson.dumps({"id": id, "type": "subscribe", "payload": payload}).decode()
        )

    async def until_ended(self, n: int, within: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while len(self.ended) < n:
            assert loop.time() < deadline, f"{len(self.ended)} of {n} ended: {self.answers}"
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def socket_of(url: str, token: str) -> AsyncIterator[Socket]:
    async with ws_connect(url, subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
        await ws.send(orjson.dumps(init).decode())
        assert orjson.loads(await asyncio.wait_for(ws.recv(), 10)) == {"type": "connection_ack"}
        socket = Socket(ws)
        try:
            yield socket
        finally:
            socket._reader.cancel()


SESSION_EVENTS = "subscription($s: ID!) { sessionEvents(sessionId: $s) { seq } }"


async def test_a_flood_over_one_websocket_counts_against_the_same_limit(
    database_url: str, db: Any
) -> None:
    settings = fast_settings(pool_size=4, tenant_max_concurrent=2, pool_timeout_s=1.0)
    async with serve_in_process(database_url, settings) as server:
        async with two_tenants(server) as (a, b, a_token, a_session, b_session):
            async with socket_of(server.ws_url, a_token) as flood:
                # Subscriptions waiting for events hold no slot: with three of
                # them open, tenant a's two slots are still free.
                for n in range(3):
                    await flood.send(f"sub{n}", SESSION_EVENTS, {"s": a_session})
                await asyncio.sleep(0.3)
                quick = await a.post(
                    "/graphql", json={"query": QUICK_READ, "variables": {"id": a_session}}
                )
                assert quick.json() == {"data": {"session": {"id": a_session}}}, quick.text

                async with events_locked(db):
                    for n in range(6):
                        await flood.send(f"q{n}", SLOW_READ, {"id": a_session})
                    # Two run and hold their connections; the other four wait
                    # their turn, briefly, and are turned away with the typed
                    # busy answer, never having run.
                    await flood.until_ended(4, within=15)
                    assert set(flood.ended.values()) == {"error"}, flood.answers
                    for id in flood.ended:
                        [message] = flood.answers[id]
                        [error] = message["payload"]
                        assert error["extensions"] == {"code": "UNAVAILABLE", "retryable": True}
                    # Over HTTP the same tenant finds its slots taken by the socket.
                    over_http = await a.post(
                        "/graphql", json={"query": QUICK_READ, "variables": {"id": a_session}}
                    )
                    assert over_http.status_code == 503, over_http.text

                    # Another tenant, meanwhile: a prompt and correct answer.
                    figures.add("attack queries tried", 6)
                    probe_started = time.monotonic()
                    answer = await asyncio.wait_for(
                        b.post(
                            "/graphql", json={"query": QUICK_READ, "variables": {"id": b_session}}
                        ),
                        5,
                    )
                    figures.worst(
                        "another tenant's probe under a flood, latency",
                        (time.monotonic() - probe_started) * 1000,
                        "ms",
                    )
                    assert answer.status_code == 200, answer.text
                    assert answer.json() == {"data": {"session": {"id": b_session}}}
                    assert len(flood.ended) == 4

                # The two that ran answer once their reads can go on.
                await flood.until_ended(6, within=15)
                ran = [id for id, how in flood.ended.items() if how == "complete"]
                assert len(ran) == 2, flood.answers
                for id in ran:
                    assert flood.answers[id][0] == {
                        "id": id,
                        "type": "next",
                        "payload": {"data": {"session": {"events": {"totalCount": 0}}}},
                    }


# One request, ten root fields: graphql-core runs them at once, each reading
# on a connection of its own.
ALIASED_SLOW_READ = (
    "query($id: ID!) { "
    + " ".join(f"a{n}: session(id: $id) {{ events(first: 1) {{ totalCount }} }}" for n in range(10))
    + " }"
)


async def test_one_request_of_many_fields_holds_no_more_than_its_tenants_connections(
    database_url: str, db: Any
) -> None:
    settings = fast_settings(pool_size=4, tenant_max_concurrent=1, pool_timeout_s=1.0)
    async with serve_in_process(database_url, settings) as server:
        engine = server.app.state.runtime.engine
        shares = server.view.shares
        assert shares is not None
        connections = shares.connections
        # The most connections of the requests' pool out at once while only
        # tenant a's request asks for them (b's probe aside).
        most = 0
        probing = False

        async def sample() -> None:
            nonlocal most
            while True:
                if not probing:
                    most = max(most, engine.checkedout())
                await asyncio.sleep(0.005)

        async with two_tenants(server) as (a, b, _, a_session, b_session):
            sampler = asyncio.create_task(sample())
            running: list[asyncio.Task[Any]] = [sampler]
            try:
                async with events_locked(db):
                    aliased = asyncio.create_task(
                        a.post(
                            "/graphql",
                            json={"query": ALIASED_SLOW_READ, "variables": {"id": a_session}},
                        )
                    )
                    running.append(aliased)
                    # One of its fields reads events on its connection, and waits
                    # for the lock.
                    loop = asyncio.get_running_loop()
                    deadline = loop.time() + 15
                    while not await db.fetchval(
                        "SELECT count(*) FROM pg_locks"
                        " WHERE relation = 'events'::regclass AND NOT granted"
                    ):
                        assert loop.time() < deadline, "no read of events waits for the lock"
                        await asyncio.sleep(0.02)

                    # Another tenant, meanwhile: its data, not "the database is busy".
                    probing = True
                    answer = await asyncio.wait_for(
                        b.post(
                            "/graphql", json={"query": QUICK_READ, "variables": {"id": b_session}}
                        ),
                        10,
                    )
                    probing = False
                    assert answer.status_code == 200, answer.text
                    assert answer.json() == {"data": {"session": {"id": b_session}}}

                    # a's other fields wait for its one connection, and give up.
                    deadline = loop.time() + 15
                    while connections.waiting("a"):
                        assert loop.time() < deadline, "tenant a's fields still wait"
                        await asyncio.sleep(0.02)
                    assert connections.held("a") == 1
                    assert engine.checkedout() == 1
                    assert not aliased.done()

                # The field that held the connection answers; the others were
                # answered as a full pool answers: retryable, "busy".
                response = await asyncio.wait_for(aliased, 15)
                body = response.json()
                assert response.status_code == 200, body
                answered = {k: v for k, v in body["data"].items() if v is not None}
                assert list(answered.values()) == [{"events": {"totalCount": 0}}], body
                refused = {error["path"][0] for error in body["errors"]}
                assert refused == set(body["data"]) - set(answered), body
                for error in body["errors"]:
                    assert error["extensions"] == {"code": "UNAVAILABLE", "retryable": True}, body
                    assert "busy" in error["message"], body
                figures.add("attack queries tried", 1)
                assert most == 1, f"tenant a held {most} connections, its bound is 1"
            finally:
                for task in running:
                    task.cancel()
                await asyncio.gather(*running, return_exceptions=True)
