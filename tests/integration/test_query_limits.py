"""A legal query cannot cost without bound: what it may cost is decided before
it runs (QUERY_TOO_COSTLY), how large its answer may grow while it runs
(RESPONSE_TOO_LARGE), and a WebSocket message is as bounded as an HTTP body."""

from __future__ import annotations

import asyncio
import gc
import json
import time
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
from keyturn.runtime.auth import create_token
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


async def insert_turn_with_events(db: Any, events: int) -> str:
    """A completed turn with ``events`` events (seq 1 … events), as a long streamed reply has."""
    sid, tid = uuid.uuid4(), uuid.uuid4()
    await db.execute(
        "INSERT INTO sessions (id, default_history, event_seq) VALUES ($1, 'FULL', $2)",
        sid,
        events,
    )
    await db.execute(
        "INSERT INTO turns (id, session_id, idempotency_key, input, history, fingerprint,"
        " status, admit_seq) VALUES ($1, $2, 'k', 'hi', 'FULL', 'f', 'COMPLETED', 1)",
        tid,
        sid,
    )
    await db.execute(
        "INSERT INTO events (session_id, turn_id, seq, type, data) "
        "SELECT $1, $2, n, 'turn.delta', jsonb_build_object('text', n::text) "
        "FROM generate_series(1, $3::int) AS n",
        sid,
        tid,
        events,
    )
    return str(tid)


TURN_EVENTS = "query($id: ID!) {{ turn(id: $id) {{ events{args} {{ seq }} }} }}"


async def test_turn_events_are_costed_by_first_and_unpaged_by_the_bound_enforced(
    database_url: str, db: Any
) -> None:
    long_turn = await insert_turn_with_events(db, 101)
    full_turn = await insert_turn_with_events(db, 100)
    async with serve_in_process(database_url, fast_settings(max_query_cost=150)) as srv:
        # Unpaged, Turn.events costs its bound, 100 events: 1 + 100 * (1 + 1).
        unpaged = too_costly(await post(srv.url, TURN_EVENTS.format(args=""), {"id": full_turn}))
        assert unpaged == {"code": "QUERY_TOO_COSTLY", "cost": 201, "limit": 150}
        # Paged, it costs its first: 1 + 50 * 2.
        half = await post(srv.url, TURN_EVENTS.format(args="(first: 50)"), {"id": full_turn})
        assert [e["seq"] for e in half["data"]["turn"]["events"]] == list(range(1, 51))
        nested = (
            "{ sessions(first: 2) { edges { node { turns(first: 3) { edges { node { "
            "events(first: 30) { seq } } } } } } } }"
        )
        assert too_costly(await post(srv.url, nested))["cost"] == 1 + 2 * (3 + 3 * (2 + 60))
    async with serve_in_process(database_url, fast_settings()) as srv:
        # The bound holds: a turn with at most 100 events answers them all,
        # one with more is refused (never a list cut short) and pages instead.
        every = await post(srv.url, TURN_EVENTS.format(args=""), {"id": full_turn})
        assert [e["seq"] for e in every["data"]["turn"]["events"]] == list(range(1, 101))
        refused = await post(srv.url, TURN_EVENTS.format(args=""), {"id": long_turn})
        [error] = refused["errors"]
        assert error["extensions"]["code"] == "BAD_USER_INPUT", error
        assert "more than 100 events" in error["message"] and "afterSeq" in error["message"]
        assert refused["data"] == {"turn": None}
        seqs: list[int] = []
        while True:
            page = await post(
                srv.url,
                TURN_EVENTS.format(args="(first: $n, afterSeq: $after)").replace(
                    "$id: ID!", "$id: ID!, $n: Int, $after: Int"
                ),
                {"id": long_turn, "n": 40, "after": seqs[-1] if seqs else 0},
            )
            got = [e["seq"] for e in page["data"]["turn"]["events"]]
            if not got:
                break
            seqs += got
        assert seqs == list(range(1, 102))
        # The rest of the long turn, unpaged, is within the bound again.
        rest = await post(srv.url, TURN_EVENTS.format(args="(afterSeq: 1)"), {"id": long_turn})
        assert len(rest["data"]["turn"]["events"]) == 100
        for args, message in (
            ("(first: 101)", "first must be at most 100 (got 101)"),
            ("(first: -1)", "first must not be negative"),
            ("(afterSeq: -1)", "afterSeq must not be negative"),
        ):
            body = await post(srv.url, TURN_EVENTS.format(args=args), {"id": long_turn})
            [error] = body["errors"]
            assert error["message"] == message
            assert error["extensions"]["code"] == "BAD_USER_INPUT"


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


async def test_each_operation_on_one_websocket_has_its_own_response_budget(
    database_url: str, db: Any
) -> None:
    limit = 64 * 1024
    settings = fast_settings(max_response_bytes=limit, pool_size=12)
    sid = await insert_large_turns(db, 10, 16 * 1024)
    small = "query($id: ID!) { session(id: $id) { turns(first: 3) { edges { node { input } } } } }"
    large = small.replace("first: 3", "first: 10")  # 160 KiB: past the limit on its own
    async with serve_in_process(database_url, settings) as server:
        async with ws_connect(
            server.ws_url,
            subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
            max_size=None,
        ) as ws:
            await ws.send('{"type": "connection_init"}')
            assert "connection_ack" in str(await asyncio.wait_for(ws.recv(), 10))
            # Hold the reads back so that all the operations run at once on
            # the socket: twelve of 48 KiB, nine times the limit together.
            lock = db.transaction()
            await lock.start()
            await db.execute("LOCK TABLE turns IN ACCESS EXCLUSIVE MODE")
            try:
                for n in range(12):
                    query = large if n == 5 else small
                    message = {
                        "id": str(n),
                        "type": "subscribe",
                        "payload": {"query": query, "variables": {"id": sid}},
                    }
                    await ws.send(json.dumps(message))
                await asyncio.sleep(0.5)
            finally:
                await lock.rollback()
            answers: dict[str, dict[str, Any]] = {}
            while len(answers) < 12:
                message = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if message["type"] == "next":
                    answers[message["id"]] = message["payload"]
        for n in range(12):
            body = answers[str(n)]
            if n == 5:
                assert body.get("data") is None, str(body)[:300]
                [error] = body["errors"]
                assert error["extensions"]["code"] == "RESPONSE_TOO_LARGE", error
                assert error["extensions"]["limit"] == limit
            else:
                assert "errors" not in body, str(body)[:300]
                edges = body["data"]["session"]["turns"]["edges"]
                assert [len(e["node"]["input"]) for e in edges] == [16 * 1024] * 3


async def test_parallel_oversized_queries_each_get_the_error_and_another_tenant_is_answered(
    database_url: str, db: Any
) -> None:
    sid = await insert_large_turns(db, 60, 64 * 1024)
    await db.execute("UPDATE sessions SET tenant = 'a' WHERE id = $1::uuid", sid)
    aliases = " ".join(f"a{i}: input" for i in range(29))
    oversized = (
        "query($id: ID!) { session(id: $id) { turns(first: 60) { edges { node { "
        f"{aliases} }} }} }} }} }}"
    )
    async with serve_in_process(database_url, fast_settings()) as server:
        engine = server.app.state.runtime.engine
        tokens = {name: await create_token(engine, name=name) for name in ("a", "b")}

        async def post_as(tenant: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
            headers = {"authorization": f"Bearer {tokens[tenant]}"}
            async with httpx.AsyncClient(base_url=server.url, timeout=60, headers=headers) as http:
                response = await http.post(
                    "/graphql", json={"query": query, "variables": variables}
                )
            body: dict[str, Any] = response.json()
            return body

        b_session = (await post_as("b", "mutation { createSession { id } }", {}))["data"][
            "createSession"
        ]["id"]
        attacks = [asyncio.create_task(post_as("a", oversized, {"id": sid})) for _ in range(4)]
        await asyncio.sleep(0.05)  # under way
        started = time.monotonic()
        probe = await post_as("b", "query($id: ID!) { session(id: $id) { id } }", {"id": b_session})
        figures.worst(
            "another tenant's probe beside oversized queries, latency",
            (time.monotonic() - started) * 1000,
            "ms",
        )
        assert probe == {"data": {"session": {"id": b_session}}}
        figures.add("attack queries tried", len(attacks))
        for body in await asyncio.gather(*attacks):
            assert body.get("data") is None, str(body)[:300]
            [error] = body["errors"]
            assert error["extensions"]["code"] == "RESPONSE_TOO_LARGE", error


def process_rss(pid: int) -> int:
    """The resident memory of a server process and its children (the
    embedded PostgreSQL is not among them: it runs elsewhere in tests)."""
    proc = psutil.Process(pid)
    return int(
        proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
    )


async def test_websocket_memory_returns_after_closing_sockets_that_sent_large_messages(
    database_url: str, tmp_path: Path
) -> None:
    # Messages of 6 MiB (the body limit raised to 8 MiB to make them legal):
    # 20 sockets x 4 messages is 480 MiB sent. What a server kept of them
    # after close would show as hundreds of MiB (each operation's variables
    # left in a reference cycle were 230 MiB, until keyturn.http.memory
    # collected them); once they are freed and given back, less than a MiB
    # stays. Hence the bound: start + 64 MiB, generous against noise, far
    # below what keeping even a tenth of the messages would cost.
    server = start_server_process(
        database_url, tmp_path, name="wsmem", env={"KEYTURN_MAX_BODY_BYTES": str(8 * 2**20)}
    )
    pad = "x" * (6 * 2**20)
    query = "query($id: ID!) { session(id: $id) { id } }"

    async def one_socket(messages: int) -> None:
        async with ws_connect(
            server.ws_url,
            subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
            max_size=None,
        ) as ws:
            await ws.send('{"type": "connection_init"}')
            assert "connection_ack" in str(await asyncio.wait_for(ws.recv(), 30))
            for n in range(messages):
                payload = {"query": query, "variables": {"id": pad}}
                await ws.send(json.dumps({"id": str(n), "type": "subscribe", "payload": payload}))
            ended = 0
            while ended < messages:
                message = json.loads(await asyncio.wait_for(ws.recv(), 60))
                ended += message["type"] in ("complete", "error")

    try:
        await one_socket(2)  # warm: the first answers' imports and caches
        start = process_rss(server.proc.pid)
        peak = start

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, process_rss(server.proc.pid))
                await asyncio.sleep(0.1)

        sampler = asyncio.create_task(sample())
        try:
            await asyncio.gather(*(one_socket(4) for _ in range(20)))
        finally:
            sampler.cancel()
        # The closes handled, the connections' tasks ended and the memory
        # given back: a second after the last close (keyturn.http.memory),
        # later on a busy machine; what stays after ten seconds stays.
        bound = start + 64 * 2**20
        for _ in range(40):
            await asyncio.sleep(0.25)
            after = process_rss(server.proc.pid)
            if after <= bound:
                break
        figures.worst(
            "memory grown by 20 WebSockets of large messages, at peak",
            (peak - start) / 2**20,
            "MiB",
        )
        figures.worst("memory left after closing them", (after - start) / 2**20, "MiB")
        assert after <= bound, (start / 2**20, peak / 2**20, after / 2**20)
    finally:
        stop_process(server)
