"""Hostile input: every limit answers before execution, clearly, and writes nothing."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process

SESSION_EVENTS = "subscription($s: ID!) { sessionEvents(sessionId: $s) { seq } }"
MULTIPART = (
    '--x\r\nContent-Disposition: form-data; name="operations"\r\n\r\n'
    '{"query": "mutation { createSession { id } }"}\r\n--x--\r\n'
)


async def nothing_written(db: Any) -> None:
    assert await db.fetchval("SELECT count(*) FROM sessions") == 0
    assert await db.fetchval("SELECT count(*) FROM turns") == 0


async def post(server: InProcessServer, content: Any, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        return await http.post("/graphql", content=content, **kw)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/plain", json.dumps({"query": "mutation { createSession { id } }"})),
        (
            "application/x-www-form-urlencoded",
            "query=mutation%20%7B%20createSession%20%7B%20id%20%7D%20%7D",
        ),
        (
            "multipart/form-data; boundary=x",
            MULTIPART,
        ),
    ],
)
async def test_simple_content_types_are_refused(
    server: InProcessServer, db: Any, content_type: str, body: str
) -> None:
    response = await post(server, body, headers={"content-type": content_type})
    assert response.status_code == 415
    assert "application/json" in response.json()["errors"][0]["message"]
    await nothing_written(db)


async def test_no_mutation_over_get(server: InProcessServer, db: Any) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        response = await http.get(
            "/graphql",
            params={"query": "mutation { createSession { id } }"},
            headers={"accept": "application/json"},
        )
    assert response.status_code in {400, 405}
    await nothing_written(db)


async def test_oversized_body_is_refused(server: InProcessServer, db: Any) -> None:
    big = json.dumps(
        {"query": "mutation { createSession { id } }", "variables": {"pad": "x" * (1024 * 1024)}}
    )
    response = await post(server, big, headers={"content-type": "application/json"})
    assert response.status_code == 413
    await nothing_written(db)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            "{ sessions { edges { node { turns { edges { node { events { seq } } } } "
            "events { edges { node { seq } } } } } } }".replace("seq", "seq " * 1),
            None,
        ),
        ("{ " + " ".join(f"a{i}: sessions {{ totalCount }}" for i in range(31)) + " }", "aliases"),
        (
            "query { ...F } fragment F on Query { "
            + " ".join(f"a{i}: sessions {{ totalCount }}" for i in range(31))
            + " }",
            "aliases",
        ),
        ("{ " + "sessions { totalCount } " * 1200 + "}", "token"),
        (
            "{ sessions { edges { node { turns { edges { node { events { turnId } } } } } } } }",
            None,
        ),
    ],
)
async def test_query_limits(client: GraphQLClient, query: str, expected: str | None) -> None:
    body = await client.raw(query)
    if expected is None:
        assert not body.get("errors"), body
    else:
        assert body.get("data") is None
        assert expected in body["errors"][0]["message"].lower()


async def test_introspection_cycles_are_refused(client: GraphQLClient) -> None:
    body = await client.raw(
        "{ __schema { types { fields { type { fields { type { fields { type { fields { name } } "
        "} } } } } } } }"
    )
    assert body.get("data") is None
    assert "maximum introspection depth" in body["errors"][0]["message"].lower()


async def test_depth_limit(database_url: str) -> None:
    async with serve_in_process(database_url, fast_settings(max_query_depth=3)) as srv:
        client = GraphQLClient(srv.url)
        ok = await client.raw("{ sessions { edges { cursor } } }")
        deep = await client.raw("{ sessions { edges { node { turns { totalCount } } } } }")
        await client.close()
    assert not ok.get("errors")
    assert deep.get("data") is None
    assert "exceeds maximum operation depth of 3" in deep["errors"][0]["message"]


async def test_batches_are_not_executed(server: InProcessServer, db: Any) -> None:
    batch = json.dumps([{"query": "mutation { createSession { id } }"}] * 3)
    response = await post(server, batch, headers={"content-type": "application/json"})
    assert response.status_code == 400
    await nothing_written(db)


async def test_unexpected_errors_are_masked_and_logged(
    server: InProcessServer, client: GraphQLClient, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = server.app.state.runtime

    async def broken(*_a: Any, **_k: Any) -> None:
        raise RuntimeError('relation "secret_table" does not exist: SELECT * FROM secret_table')

    original = runtime.reads.sessions
    runtime.reads.sessions = broken
    try:
        with caplog.at_level(logging.ERROR, logger="keyturn.schema.errors"):
            body = await client.raw("{ sessions { totalCount } }")
    finally:
        runtime.sessions = original
    text = json.dumps(body)
    assert body["errors"][0]["message"] == "Unexpected error."
    assert "secret_table" not in text and "Traceback" not in text
    assert "secret_table" in caplog.text


@pytest.fixture
async def locked_down(database_url: str) -> AsyncIterator[InProcessServer]:
    settings = fast_settings(
        introspection=False,
        graphiql=False,
        max_subscriptions_per_connection=2,
        connection_init_timeout_s=0.5,
        allowed_origins="https://app.example",
    )
    async with serve_in_process(database_url, settings) as srv:
        yield srv


async def test_introspection_and_graphiql_can_be_switched_off(
    locked_down: InProcessServer,
) -> None:
    client = GraphQLClient(locked_down.url)
    body = await client.raw("{ __schema { queryType { name } } }")
    assert body.get("data") is None and "introspection" in body["errors"][0]["message"].lower()
    assert (await client.execute("{ sessions { totalCount } }"))["sessions"]["totalCount"] == 0
    page = await client.http.get("/graphql", headers={"accept": "text/html"})
    assert page.status_code != 200 or "graphiql" not in page.text.lower()
    await client.close()


async def test_websocket_origin_is_checked(locked_down: InProcessServer) -> None:
    host = locked_down.url.removeprefix("http://")
    for origin, allowed in [
        ("https://evil.example", False),
        (f"http://{host}", True),
        ("https://app.example", True),
        (None, True),  # not a browser
    ]:
        headers = {"Origin": origin} if origin else {}
        try:
            async with ws_connect(
                locked_down.ws_url,
                subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
                additional_headers=headers,
            ) as ws:
                await ws.send(json.dumps({"type": "connection_init"}))
                reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
                accepted = reply["type"] == "connection_ack"
        except (InvalidStatus, ConnectionClosed):
            accepted = False
        assert accepted is allowed, origin


async def test_subscriptions_per_connection_and_init_timeout(
    locked_down: InProcessServer,
) -> None:
    client = GraphQLClient(locked_down.url)
    sid = await client.create_session()
    await client.close()
    async with ws_connect(locked_down.ws_url, subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(json.dumps({"type": "connection_init"}))
        assert json.loads(await ws.recv())["type"] == "connection_ack"
        for n in range(3):
            await ws.send(
                json.dumps(
                    {
                        "id": str(n),
                        "type": "subscribe",
                        "payload": {
                            "query": SESSION_EVENTS,
                            "variables": {"s": sid},
                        },
                    }
                )
            )
        reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert reply["type"] == "error" and reply["id"] == "2"
        assert "limit" in reply["payload"][0]["message"].lower()
    async with ws_connect(locked_down.ws_url, subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)  # never sends connection_init
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4408
