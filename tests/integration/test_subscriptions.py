"""Subscriptions over a real WebSocket (graphql-transport-ws), through the gql client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from gql.transport.exceptions import TransportQueryError
from websockets.asyncio.client import connect as ws_connect
from websockets.typing import Subprotocol

from keyturn.db import reads
from tests.support import (
    SESSION_EVENTS,
    TURN_COMPLETED,
    GraphQLClient,
    InProcessServer,
    request,
    serve_in_process,
    ws_session,
)
from tests.support.statements import counting_statements


async def test_turn_completed_arrives_live_then_the_stream_ends(
    server: InProcessServer, client: GraphQLClient
) -> None:
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "/sleep 700 wait for me"))["turn"]
    async with ws_session(server.ws_url) as ws:
        results = [r async for r in ws.subscribe(request(TURN_COMPLETED, t=turn["id"]))]
    assert len(results) == 1
    got = results[0]["turnCompleted"]
    assert got["id"] == turn["id"] and got["status"] == "COMPLETED"
    assert got["output"].startswith("fixture reply to: /sleep 700")


async def test_turn_completed_answers_at_once_for_an_ended_turn(
    server: InProcessServer, client: GraphQLClient
) -> None:
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "/fail"))["turn"]
    await client.wait_for_status(turn["id"], {"FAILED"})
    async with ws_session(server.ws_url) as ws:
        results = [r async for r in ws.subscribe(request(TURN_COMPLETED, t=turn["id"]))]
    assert [r["turnCompleted"]["status"] for r in results] == ["FAILED"]


@pytest.mark.parametrize("turn_id", ["00000000-0000-4000-8000-000000000000", "not-an-id"])
async def test_turn_completed_for_an_unknown_turn_is_an_error_not_a_hang(
    server: InProcessServer, turn_id: str
) -> None:
    async with ws_session(server.ws_url) as ws:
        with pytest.raises(TransportQueryError) as caught:
            async with asyncio.timeout(10):
                async for _ in ws.subscribe(request(TURN_COMPLETED, t=turn_id)):
                    pass
    assert "not found" in str(caught.value)


async def test_session_events_replays_from_the_cursor_then_streams_live_without_gaps(
    server: InProcessServer, client: GraphQLClient
) -> None:
    sid = await client.create_session()
    first = (await client.submit(sid, "k0", "before"))["turn"]
    await client.wait_for_status(first["id"], {"COMPLETED"})  # seq 1..3 exist
    received: list[dict[str, Any]] = []
    async with ws_session(server.ws_url) as ws:

        async def listen() -> None:
            async for r in ws.subscribe(request(SESSION_EVENTS, s=sid, a=1)):
                received.append(r["sessionEvents"])
                if len(received) == 2 + 3 * 20:
                    return

        task = asyncio.create_task(listen())
        # Writes racing with the catch-up read and the live stream.
        await asyncio.gather(*(client.submit(sid, f"k{n}", f"n{n}") for n in range(1, 21)))
        async with asyncio.timeout(30):
            await task
    seqs = [e["seq"] for e in received]
    assert seqs == list(range(2, 2 + 2 + 3 * 20))
    assert received[0]["type"] == "turn.running"


async def test_session_events_for_unknown_session_is_an_error(server: InProcessServer) -> None:
    async with ws_session(server.ws_url) as ws:
        with pytest.raises(TransportQueryError) as caught:
            async with asyncio.timeout(10):
                async for _ in ws.subscribe(
                    request(SESSION_EVENTS, s="00000000-0000-4000-8000-000000000000", a=0)
                ):
                    pass
    assert "not found" in str(caught.value)


async def test_many_listeners_on_one_turn_each_get_it_once(
    server: InProcessServer, client: GraphQLClient
) -> None:
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "/sleep 1000"))["turn"]
    async with ws_session(server.ws_url) as ws:

        async def one() -> list[Any]:
            return [r async for r in ws.subscribe(request(TURN_COMPLETED, t=turn["id"]))]

        results = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(50))), 30)
    assert all(len(r) == 1 and r[0]["turnCompleted"]["status"] == "COMPLETED" for r in results)


async def test_listeners_subscribing_to_one_running_turn_share_one_read_of_it(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storm of listeners on one turn (every page of an agent frontend
    open at once) costs the database one read of the turn, not one per
    listener, and each still gets the turn's end once."""
    with counting_statements(monkeypatch) as seen:
        async with serve_in_process(database_url) as srv:
            client = GraphQLClient(srv.url)
            sid = await client.create_session()
            turn = (await client.submit(sid, "k", "/sleep 1500"))["turn"]
            await client.close()
            async with ws_session(srv.ws_url) as ws:

                async def one() -> list[Any]:
                    return [r async for r in ws.subscribe(request(TURN_COMPLETED, t=turn["id"]))]

                results = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(50))), 30)
    assert all(len(r) == 1 and r[0]["turnCompleted"]["status"] == "COMPLETED" for r in results)
    assert seen.count(str(reads._TURN_AND_SEQ)) == 1, seen.count(str(reads._TURN_AND_SEQ))


async def test_the_websocket_handshake_answer_carries_the_connections_request_id(
    server: InProcessServer,
) -> None:
    # As every HTTP answer does: the client's own id when it sent one, else a new one.
    protocols = [Subprotocol("graphql-transport-ws")]
    headers = {"X-Request-ID": "ws-probe.1"}
    async with ws_connect(server.ws_url, subprotocols=protocols, additional_headers=headers) as ws:
        assert ws.response is not None
        assert ws.response.headers["x-request-id"] == "ws-probe.1"
    async with ws_connect(server.ws_url, subprotocols=protocols) as ws:
        assert ws.response is not None
        made = ws.response.headers["x-request-id"]
        assert len(made) == 32 and made != "ws-probe.1"
