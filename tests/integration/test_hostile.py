"""Hostile input: every limit answers before execution, clearly, and writes nothing."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psutil
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from keyturn.runtime.auth import create_token
from tests import figures
from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process
from tests.support.client import MUTATION_SUBMIT

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


# -- attack queries against another tenant's probe and running turn -----------

# Legal reads at the edge of the limits, and reads the limits refuse: what one
# tenant may send while another's turn runs on the same process.
ATTACKS = [
    # Within the cost limit: every session's turns with their events and tool
    # calls, and every session's own page of events.
    "{ sessions(first: 20) { edges { node { "
    "turns(first: 20) { edges { node { input output events(first: 20) { seq type data } "
    "toolCalls { state } } } } events(first: 50) { edges { node { seq data } } } } } } }",
    # The hundred by hundred: refused by its cost, before anything is read.
    "{ sessions(first: 100) { edges { node { turns(first: 100) { edges { node { "
    "events { seq } toolCalls { state } } } } } } } }",
    # Aliases of the large fields: refused by the cost, or by the response limit.
    "{ sessions(first: 20) { edges { node { "
    + " ".join(f"a{i}: turns(first: 20) {{ edges {{ node {{ input }} }} }}" for i in range(29))
    + " } } } }",
    # One alias past the limit.
    "{ " + " ".join(f"a{i}: sessions {{ totalCount }}" for i in range(31)) + " }",
]
# What an attack may be answered with: data, or one of the typed refusals.
REFUSALS = {"QUERY_TOO_COSTLY", "RESPONSE_TOO_LARGE", "UNAVAILABLE", "GRAPHQL_VALIDATION_FAILED"}
PROBE = "query($id: ID!) { session(id: $id) { id turns(first: 5) { totalCount } } }"


def rss_bytes() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


async def seed_tenant(db: Any, tenant: str, sessions: int, turns: int) -> None:
    """Sessions of ``tenant`` with completed turns of 4 KiB inputs and outputs, and events."""
    for _ in range(sessions):
        sid = uuid.uuid4()
        await db.execute(
            "INSERT INTO sessions (id, tenant, default_history, event_seq) "
            "VALUES ($1, $2, 'FULL', $3)",
            sid,
            tenant,
            turns * 3,
        )
        for n in range(turns):
            tid = uuid.uuid4()
            await db.execute(
                "INSERT INTO turns (id, session_id, idempotency_key, input, history, fingerprint,"
                " status, output, admit_seq) VALUES ($1, $2, $3, $4, 'FULL', 'f', 'COMPLETED',"
                " $4, $5)",
                tid,
                sid,
                f"k{n}",
                "x" * 4096,
                3 * n + 1,
            )
            await db.execute(
                "INSERT INTO events (session_id, turn_id, seq, type, data) "
                "SELECT $1, $2, $3 + i, t, jsonb_build_object('text', repeat('y', 512)) "
                "FROM unnest(ARRAY['turn.started', 'turn.delta', 'turn.completed']) "
                "WITH ORDINALITY AS e(t, i)",
                sid,
                tid,
                3 * n,
            )


def attack_answer_is_typed(response: httpx.Response) -> None:
    """Data, or a typed refusal: never a masked error, never a dropped connection."""
    body = response.json()
    for error in body.get("errors") or []:
        code = (error.get("extensions") or {}).get("code")
        assert code in REFUSALS or "aliases" in error["message"], body
        assert error["message"] != "Unexpected error.", body


async def test_attack_queries_neither_interrupt_nor_stall_another_tenants_turn(
    database_url: str, db: Any
) -> None:
    async with serve_in_process(database_url, fast_settings()) as server:
        engine = server.app.state.runtime.engine
        attacker_token = await create_token(engine, name="attacker")
        victim_token = await create_token(engine, name="victim")
        await seed_tenant(db, "attacker", 20, 20)
        attacker = httpx.AsyncClient(
            base_url=server.url, timeout=60, headers={"authorization": f"Bearer {attacker_token}"}
        )
        victim = httpx.AsyncClient(
            base_url=server.url, timeout=60, headers={"authorization": f"Bearer {victim_token}"}
        )

        async def victim_asks(query: str, variables: dict[str, Any]) -> dict[str, Any]:
            response = await victim.post("/graphql", json={"query": query, "variables": variables})
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            assert not body.get("errors"), body
            data: dict[str, Any] = body["data"]
            return data

        try:
            made = await victim_asks("mutation { createSession { id } }", {})
            sid = made["createSession"]["id"]
            # Longer than the lease (3 s): it completes only if it is renewed
            # throughout the attack.
            submitted = await victim_asks(
                MUTATION_SUBMIT,
                {"input": {"sessionId": sid, "idempotencyKey": "k", "input": "/sleep 4500"}},
            )
            turn_id = submitted["submitTurn"]["turn"]["id"]

            before = rss_bytes()
            peak = before
            stop = asyncio.Event()
            tried = 0

            async def attack() -> None:
                nonlocal tried
                while not stop.is_set():
                    # Five at once of every shape, as the attacker sent them.
                    wave = [
                        attacker.post("/graphql", json={"query": q})
                        for q in ATTACKS
                        for _ in range(5)
                    ]
                    for response in await asyncio.gather(*wave):
                        attack_answer_is_typed(response)
                    tried += len(wave)

            attackers = asyncio.create_task(attack())
            worst_ms = 0.0
            status = "QUEUED"
            deadline = time.monotonic() + 30
            try:
                while status in ("QUEUED", "RUNNING") and time.monotonic() < deadline:
                    started = time.monotonic()
                    probe = await victim_asks(PROBE, {"id": sid})
                    worst_ms = max(worst_ms, (time.monotonic() - started) * 1000)
                    assert probe["session"] == {"id": sid, "turns": {"totalCount": 1}}
                    peak = max(peak, rss_bytes())
                    status = await db.fetchval(
                        "SELECT status FROM turns WHERE id = $1::uuid", turn_id
                    )
                    await asyncio.sleep(0.1)
            finally:
                stop.set()
                await attackers
            # Measured, not asserted: the machine's timing is shared and noisy.
            figures.add("attack queries tried", tried)
            figures.worst("other tenant's probe latency under attack", worst_ms, "ms")
            figures.worst("server RSS growth under attack", (peak - before) / 2**20, "MiB")
            figures.add("other tenants' turns interrupted", int(status == "INTERRUPTED"))
            assert tried >= len(ATTACKS) * 5
            assert status == "COMPLETED"
            events = await db.fetch(
                "SELECT type FROM events WHERE turn_id = $1::uuid ORDER BY seq", turn_id
            )
            assert "turn.interrupted" not in [e["type"] for e in events]
        finally:
            await attacker.aclose()
            await victim.aclose()
