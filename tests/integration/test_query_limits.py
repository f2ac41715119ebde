"""A legal query cannot cost without bound: what it may cost is decided before
it runs (QUERY_TOO_COSTLY), how large its answer may grow while it runs
(RESPONSE_TOO_LARGE), and a WebSocket message is as bounded as an HTTP body."""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from keyturn.db import reads as db_reads
from keyturn.db import sql
from tests import figures
from tests.support import (
    InProcessServer,
    fast_settings,
    serve_in_process,
    start_server_process,
    stop_process,
)
from tests.support.statements import counting_statements

# The query: 100 sessions by 100 turns, with their events and tool calls.
HUNDRED_BY_HUNDRED = (
    "{ sessions(first: 100) { edges { node { turns(first: 100) { edges { node { "
    "events { seq } toolCalls { state } } } } } } } }"
)


async def post(url: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        response = await http.post("/graphql", json={"query": query, "variables": variables or {}})
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture
async def quiet_server(database_url: str) -> AsyncIterator[InProcessServer]:
    settings = fast_settings(claim_poll_s=600, subscription_poll_s=600, auth_recheck_s=600)
    async with serve_in_process(database_url, settings) as srv:
        yield srv


def too_costly(body: dict[str, Any]) -> dict[str, Any]:
    assert body.get("data") is None, body
    [error] = body["errors"]
    assert error["extensions"]["code"] == "QUERY_TOO_COSTLY", error
    assert str(error["extensions"]["limit"]) in error["message"]
    assert str(error["extensions"]["cost"]) in error["message"]
    return dict(error["extensions"])


async def test_the_hundred_by_hundred_query_is_refused_before_anything_is_read(
    quiet_server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with counting_statements(monkeypatch) as seen:
        body = await post(quiet_server.url, HUNDRED_BY_HUNDRED)
    ext = too_costly(body)
    assert ext["limit"] == 200_000 and ext["cost"] > ext["limit"]
    # No resolver ran: none of the reads of the record.
    reads = {v.text for v in vars(db_reads).values() if isinstance(v, sql.Statement)}
    assert [s for s in seen if s in reads] == []


async def test_cost_counts_pages_defaults_fragments_and_variables(database_url: str) -> None:
    async with serve_in_process(database_url, fast_settings(max_query_cost=61)) as srv:
        # 1 for sessions, and for each of its 20 (the default page): edges, node, id.
        assert (await post(srv.url, "{ sessions { edges { node { id } } } }"))["data"]
        over = too_costly(await post(srv.url, "{ sessions(first: 21) { edges { node { id } } } }"))
        assert over == {"code": "QUERY_TOO_COSTLY", "cost": 64, "limit": 61}
        # The same through a fragment.
        fragment = (
            "{ sessions(first: 21) { ...S } } "
            "fragment S on SessionConnection { edges { node { id } } }"
        )
        assert too_costly(await post(srv.url, fragment))["cost"] == 64
        # A variable counts as the most it may be (100): its value is not known
        # when the document is validated.
        variable = "query($n: Int) { sessions(first: $n) { edges { node { id } } } }"
        assert too_costly(await post(srv.url, variable, {"n": 1}))["cost"] == 301
        # Large fields weigh more: a turn's input costs 10.
        large = (
            "{ sessions(first: 2) { edges { node { turns(first: 3) { edges { node { input } } } } "
            "} } }"
        )
        assert too_costly(await post(srv.url, large))["cost"] == 1 + 2 * (3 + 3 * 12)


async def insert_large_turns(db: Any, turns: int, size: int) -> str:
    sid = uuid.uuid4()
    await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'FULL')", sid)
    for n in range(turns):
        await db.execute(
            "INSERT INTO turns (id, session_id, idempotency_key, input, history, fingerprint,"
            " status, admit_seq) VALUES ($1, $2, $3, $4, 'FULL', 'f', 'COMPLETED', $5)",
            uuid.uuid4(),
            sid,
            f"k{n}",
            chr(ord("a") + n % 26) * size,
            n + 1,
        )
    return str(sid)


def rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


async def test_a_response_past_the_limit_is_one_error_and_no_data(
    server: InProcessServer, db: Any
) -> None:
    # 60 turns of 64 KiB, each input asked for 29 times: over 100 MiB of JSON.
    sid = await insert_large_turns(db, 60, 64 * 1024)
    aliases = " ".join(f"a{i}: input" for i in range(29))
    query = (
        "query($id: ID!) { session(id: $id) { turns(first: 60) { edges { node { "
        f"{aliases} }} }} }} }} }}"
    )
    before = rss()
    body = await post(server.url, query, {"id": sid})
    grown = rss() - before
    figures.add("attack queries tried")
    figures.worst("memory grown by an oversized answer", grown / 2**20, "MiB")
    assert body.get("data") is None, str(body)[:300]
    [error] = body["errors"]
    assert error["extensions"]["code"] == "RESPONSE_TOO_LARGE"
    assert error["extensions"]["limit"] == 4 * 1024 * 1024
    assert str(4 * 1024 * 1024) in error["message"]
    # The turns themselves are 4 MiB; an answer built whole would be over 100.
    assert grown < 48 * 1024 * 1024, grown
    # A smaller answer of the same shape still comes.
    small = await post(
        server.url,
        "query($id: ID!) { session(id: $id) { turns(first: 2) { edges { node { a: input } } } } }",
        {"id": sid},
    )
    assert [len(e["node"]["a"]) for e in small["data"]["session"]["turns"]["edges"]] == [65536] * 2


async def test_a_websocket_message_larger_than_the_body_limit_is_refused(
    database_url: str, tmp_path: Path
) -> None:
    server = start_server_process(database_url, tmp_path, name="wsmax")
    try:
        async with ws_connect(
            server.ws_url,
            subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
            max_size=None,
        ) as ws:
            await ws.send('{"type": "connection_init"}')
            assert "connection_ack" in str(await asyncio.wait_for(ws.recv(), 10))
            big = (
                '{"id": "1", "type": "subscribe", "payload": {"query": "'
                + "x" * (2 * 1024 * 1024)
                + '"}}'
            )
            with pytest.raises(ConnectionClosed) as closed:
                await ws.send(big)
                await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    finally:
        stop_process(server)
