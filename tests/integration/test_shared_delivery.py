"""A turn's end completed once for every listener that asked for it the same
way (keyturn.schema.execution): the same document and variables get the same
bytes from one completion; another document, other variables, or a selection
that reads more than the turn (a resolver) are completed per listener."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.typing import Subprotocol

from keyturn.schema.execution import DELIVERIES
from tests.support import GraphQLClient, InProcessServer

PLAIN = "subscription($t: ID!) { turnCompleted(turnId: $t) { id status output error } }"
OTHER = "subscription($t: ID!) { turnCompleted(turnId: $t) { status completedAt epoch } }"
WITH_EVENTS = "subscription($t: ID!) { turnCompleted(turnId: $t) { id events { seq type } } }"


async def _open(ws_url: str) -> ClientConnection:
    ws = await ws_connect(ws_url, subprotocols=[Subprotocol("graphql-transport-ws")])
    await ws.send('{"type":"connection_init","payload":{}}')
    assert json.loads(await ws.recv())["type"] == "connection_ack"
    return ws


async def _listen(ws: ClientConnection, query: str, variables: dict[str, Any]) -> list[str]:
    """The raw text of every ``next`` message, until ``complete``."""
    await ws.send(
        json.dumps(
            {
                "id": "1",
                "type": "subscribe",
                "payload": {"query": query, "variables": variables},
            }
        )
    )
    frames: list[str] = []
    while True:
        text = await ws.recv()
        assert isinstance(text, str)
        kind = json.loads(text)["type"]
        if kind == "next":
            frames.append(text)
        elif kind == "complete":
            return frames
        elif kind == "ping":
            await ws.send('{"type":"pong"}')
        else:
            raise AssertionError(text)


async def _deliver(
    server: InProcessServer, client: GraphQLClient, asks: list[tuple[str, bool]]
) -> tuple[list[list[str]], int, int, str]:
    """Each document subscribed on its own connection while one turn runs,
    with the turn's id in upper case where asked; the frames each got, and
    how many completions the server ran and shared for them."""
    sid = await client.create_session()
    turn_id = (await client.submit(sid, "k", "/sleep 3000"))["turn"]["id"]
    conns = await asyncio.gather(*(_open(server.ws_url) for _ in asks))
    try:
        executed, shared = DELIVERIES.executed, DELIVERIES.shared
        tasks = [
            asyncio.create_task(_listen(ws, query, {"t": turn_id.upper() if upper else turn_id}))
            for ws, (query, upper) in zip(conns, asks, strict=True)
        ]
        await asyncio.sleep(0.3)
        # Every listener subscribed to the running turn: its end is a delivery.
        assert (await client.turn(turn_id) or {})["status"] == "RUNNING"
        got = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return got, DELIVERIES.executed - executed, DELIVERIES.shared - shared, turn_id
    finally:
        await asyncio.gather(*(ws.close() for ws in conns))


async def test_fifty_listeners_with_one_document_get_one_completion_and_the_same_bytes(
    server: InProcessServer, client: GraphQLClient
) -> None:
    got, executed, shared, turn_id = await _deliver(server, client, [(PLAIN, False)] * 50)
    assert all(len(frames) == 1 for frames in got)
    assert len({frames[0] for frames in got}) == 1
    assert (executed, shared) == (1, 49)
    # The answer a query of the same turn reads on its own.
    alone = await client.execute(
        "query($t: ID!) { turn(id: $t) { id status output error } }", {"t": turn_id}
    )
    answer = json.loads(got[0][0])["payload"]
    assert answer == {"data": {"turnCompleted": alone["turn"]}}
    assert answer["data"]["turnCompleted"]["status"] == "COMPLETED"


async def test_two_documents_or_two_sets_of_variables_are_two_completions(
    server: InProcessServer, client: GraphQLClient
) -> None:
    got, executed, shared, _ = await _deliver(
        server, client, [(PLAIN, False)] * 20 + [(OTHER, False)] * 20
    )
    assert len({frames[0] for frames in got[:20]}) == 1
    assert len({frames[0] for frames in got[20:]}) == 1
    assert got[0] != got[20]
    assert (executed, shared) == (2, 38)

    # One turn's id in two spellings: the same record, but other variables.
    got, executed, shared, _ = await _deliver(
        server, client, [(PLAIN, False)] * 10 + [(PLAIN, True)] * 10
    )
    assert len({frames[0] for frames in got}) == 1
    assert (executed, shared) == (2, 18)


async def test_a_selection_with_a_resolver_is_completed_for_each_listener(
    server: InProcessServer, client: GraphQLClient
) -> None:
    # Turn.events reads the database with its listener's context: not shared.
    got, executed, shared, _ = await _deliver(server, client, [(WITH_EVENTS, False)] * 10)
    assert len({frames[0] for frames in got}) == 1
    events = json.loads(got[0][0])["payload"]["data"]["turnCompleted"]["events"]
    assert events[-1]["type"] == "turn.completed"
    assert (executed, shared) == (10, 0)
