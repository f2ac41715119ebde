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
        ("subscription($t: ID!) { turnEvents(turnId: $t) { seq } }", {"t": tid}),
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


async def test_only_the_bearer_scheme_is_accepted_in_any_case(server: InProcessServer) -> None:
    # RFC 6750: ``Bearer``, in any case. A bare token is refused with a message
    # naming the missing scheme, so a client that forgot it learns why instead
    # of working against one server and failing against every other.
    [token] = await tokens_for(server, "alice")
    await asyncio.sleep(0.4)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for value in (f"Bearer {token}", f"bearer {token}", f"BEARER  {token}"):
            ok = await http.post(
                "/graphql",
                json={"query": "{ sessions { totalCount } }"},
                headers={"authorization": value},
            )
            assert ok.status_code == 200, value
        for value, words in [(token, "no scheme"), (f"Basic {token}", "only the Bearer scheme")]:
            for response in (
                await http.post(
                    "/graphql",
                    json={"query": "{ sessions { totalCount } }"},
                    headers={"authorization": value},
                ),
                await http.get(
                    "/graphql",
                    params={"query": "{ sessions { totalCount } }"},
                    headers={"authorization": value, "accept": "application/json"},
                ),
            ):
                assert response.status_code == 401
                [error] = response.json()["errors"]
                assert words in error["message"] and "Bearer TOKEN" in error["message"]
                assert error["extensions"]["code"] == "UNAUTHENTICATED"
                assert token not in response.text


async def test_a_bare_token_on_the_websocket_is_closed_saying_why(server: InProcessServer) -> None:
    [token] = await tokens_for(server, "alice")
    await asyncio.sleep(0.4)
    for init in ({"authorization": token}, {"token": token}):
        async with ws_connect(server.ws_url, subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
            await ws.send(json.dumps({"type": "connection_init", "payload": init}))
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
        assert "no scheme" in closed.value.rcvd.reason
    async with ws_connect(server.ws_url, subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        payload = {"authorization": f"bearer {token}"}
        await ws.send(json.dumps({"type": "connection_init", "payload": payload}))
        assert json.loads(await ws.recv())["type"] == "connection_ack"


async def test_queries_over_get_need_the_token_too(server: InProcessServer) -> None:
    [token] = await tokens_for(server, "alice")
    await asyncio.sleep(0.4)
    params = {"query": "{ sessions { totalCount } }"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        refused = await http.get("/graphql", params=params, headers={"accept": "*/*"})
        assert refused.status_code == 401
        ok = await http.get(
            "/graphql", params=params, headers={"authorization": f"Bearer {token}", "accept": "*/*"}
        )
        assert ok.status_code == 200 and ok.json()["data"]["sessions"]["totalCount"] == 0
        # The GraphiQL page is static and carries no data: a browser gets it.
        page = await http.get("/graphql", headers={"accept": "text/html"})
        assert page.status_code == 200


async def test_metrics_need_a_token_once_tokens_exist(server: InProcessServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        assert (await http.get("/metrics")).status_code == 200  # open server
        [token] = await tokens_for(server, "alice")
        await asyncio.sleep(0.4)
        refused = await http.get("/metrics")
        assert refused.status_code == 401 and "keyturn_" not in refused.text
        ok = await http.get("/metrics", headers={"authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and "keyturn_admissions" in ok.text


async def test_metrics_public_opens_them_for_a_scraper(database_url: str) -> None:
    async with serve_in_process(database_url, fast_settings(metrics_public=True)) as srv:
        await tokens_for(srv, "alice")
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
            assert (await http.get("/metrics")).status_code == 200
            assert (
                await http.post("/graphql", json={"query": "{ sessions { totalCount } }"})
            ).status_code == 401
