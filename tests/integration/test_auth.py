"""Who may do what: tokens on HTTP and WebSocket, tenants, revocation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from keyturn.runtime.auth import create_token, revoke_token
from tests.support import (
    MUTATION_SUBMIT,
    InProcessServer,
    fast_settings,
    serve_in_process,
)


@pytest.fixture
async def server(database_url: str) -> AsyncIterator[InProcessServer]:
    async with serve_in_process(database_url, fast_settings(auth_recheck_s=0.3)) as srv:
        yield srv


class Caller:
    """GraphQL over HTTP with a given Authorization header."""

    def __init__(self, url: str, token: str | None) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=url, headers=headers, timeout=30)

    async def post(self, query: str, variables: dict[str, Any] | None = None) -> httpx.Response:
        return await self.http.post("/graphql", json={"query": query, "variables": variables})

    async def data(self, query: str, variables: dict[str, Any] | None = None) -> Any:
        response = await self.post(query, variables)
        assert response.status_code == 200, response.text
        body = response.json()
        assert not body.get("errors"), body
        return body["data"]

    async def close(self) -> None:
        await self.http.aclose()


async def tokens_for(server: InProcessServer, *names: str) -> list[str]:
    engine = server.app.state.runtime.engine
    return [await create_token(engine, name=n) for n in names]


async def test_open_until_a_token_exists_then_every_request_needs_one(
    server: InProcessServer,
) -> None:
    anonymous = Caller(server.url, None)
    assert (await anonymous.data("mutation { createSession { id } }"))["createSession"]["id"]
    [token] = await tokens_for(server, "alice")
    await asyncio.sleep(0.4)  # the "tokens exist" answer is cached this long
    for caller in (anonymous, Caller(server.url, "kt_wrong"), Caller(server.url, "")):
        response = await caller.post("mutation { createSession { id } }")
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
        await caller.close()
    alice = Caller(server.url, token)
    assert (await alice.data("{ sessions { totalCount } }"))["sessions"]["totalCount"] == 0
    await alice.close()


async def test_another_tenants_things_read_as_not_found(server: InProcessServer, db: Any) -> None:
    a_token, b_token = await tokens_for(server, "alice", "bob")
    alice, bob = Caller(server.url, a_token), Caller(server.url, b_token)
    sid = (await alice.data("mutation { createSession { id } }"))["createSession"]["id"]
    submitted = (
        await alice.data(
            MUTATION_SUBMIT,
            {"input": {"sessionId": sid, "idempotencyKey": "k", "input": "secret plans"}},
        )
    )["submitTurn"]
    tid = submitted["turn"]["id"]

    assert (await bob.data("query($i: ID!) { session(id: $i) { id } }", {"i": sid})) == {
        "session": None
    }
    assert (await bob.data("query($i: ID!) { turn(id: $i) { id } }", {"i": tid})) == {"turn": None}
    assert (await bob.data("{ sessions { totalCount } }"))["sessions"]["totalCount"] == 0
    answer = (
        await bob.data(
            MUTATION_SUBMIT,
            {"input": {"sessionId": sid, "idempotencyKey": "k", "input": "secret plans"}},
        )
    )["submitTurn"]
    assert answer["__typename"] == "SessionNotFound"
    assert await db.fetchval("SELECT count(*) FROM turns") == 1

    # The same key in two tenants names two turns.
    bob_sid = (await bob.data("mutation { createSession { id } }"))["createSession"]["id"]
    bobs = (
        await bob.data(
            MUTATION_SUBMIT,
            {"input": {"sessionId": bob_sid, "idempotencyKey": "k", "input": "secret plans"}},
        )
    )["submitTurn"]
    assert bobs["__typename"] == "TurnAccepted" and bobs["turn"]["id"] != tid

    # Subscriptions too.
    for query, variables in [
        ("subscription($t: ID!) { turnCompleted(turnId: $t) { id } }", {"t": tid}),
        ("subscription($s: ID!) { sessionEvents(sessionId: $s) { seq } }", {"s": sid}),
    ]:
        messages = await ws_exchange(
            server, {"authorization": f"Bearer {b_token}"}, query, variables
        )
        assert messages[-1]["type"] in {"error", "complete"}
        assert all(not (m.get("payload") or {}).get("data") for m in messages)
        text = json.dumps(messages)
        assert "not found" in text and "secret plans" not in text
    await alice.close()
    await bob.close()


async def ws_exchange(
    server: InProcessServer, init: dict[str, Any], query: str, variables: dict[str, Any]
) -> list[dict[str, Any]]:
    async with ws_connect(server.ws_url, subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(json.dumps({"type": "connection_init", "payload": init}))
        assert json.loads(await ws.recv())["type"] == "connection_ack"
        await ws.send(
            json.dumps(
                {
                    "id": "1",
                    "type": "subscribe",
                    "payload": {"query": query, "variables": variables},
                }
            )
        )
        out: list[dict[str, Any]] = []
        async with asyncio.timeout(10):
            while True:
                message = json.loads(await ws.recv())
                out.append(message)
                if message["type"] in {"complete", "error"}:
                    return out


@pytest.mark.parametrize("init", [{}, {"authorization": "Bearer kt_nope"}, {"token": ""}])
async def test_websocket_without_a_valid_token_is_closed_4403(
    server: InProcessServer, init: dict[str, Any]
) -> None:
    await tokens_for(server, "alice")
    await asyncio.sleep(0.4)
    async with ws_connect(server.ws_url, subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(json.dumps({"type": "connection_init", "payload": init}))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403


async def test_revoking_a_token_closes_its_live_subscriptions_and_refuses_it(
    server: InProcessServer,
) -> None:
    [token] = await tokens_for(server, "alice")
    alice = Caller(server.url, token)
    sid = (await alice.data("mutation { createSession { id } }"))["createSession"]["id"]
    async with ws_connect(server.ws_url, subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(
            json.dumps({"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}})
        )
        assert json.loads(await ws.recv())["type"] == "connection_ack"
        await ws.send(
            json.dumps(
                {
                    "id": "1",
                    "type": "subscribe",
                    "payload": {
                        "query": "subscription($s: ID!) { sessionEvents(sessionId: $s) { seq } }",
                        "variables": {"s": sid},
                    },
                }
            )
        )
        await revoke_token(server.app.state.runtime.engine, name="alice")
        with pytest.raises(ConnectionClosed) as closed:
            async with asyncio.timeout(10):
                while True:
                    await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
    response = await alice.post("{ sessions { totalCount } }")
    assert response.status_code == 401
    await alice.close()
