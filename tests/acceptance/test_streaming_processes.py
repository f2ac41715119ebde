"""Streamed output across real processes: deltas written by one server reach
subscribers of another, and a server killed mid-stream leaves its deltas."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keyturn.domain import History
from keyturn.runtime.model import FixtureModel
from tests.support import (
    GraphQLClient,
    ServerProcess,
    admin,
    owner_process,
    request,
    two_server_processes,
    ws_session,
)

pytestmark = pytest.mark.slow

TURN_EVENTS = (
    "subscription($t: ID!, $a: Int) { turnEvents(turnId: $t, afterSeq: $a) "
    "{ seq type turnId data } }"
)
# A delta as soon as 20 ms have passed: with pauses of 200 ms and more each
# piece the fixture streams is a delta of its own.
STREAMING = {"KEYTURN_DELTA_FLUSH_MS": "20"}


@pytest.fixture
def two_servers(database_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with two_server_processes(database_url, tmp_path, STREAMING) as servers:
        yield servers


async def test_turn_events_reach_a_subscriber_on_the_other_process(
    two_servers: tuple[ServerProcess, ServerProcess], database_url: str
) -> None:
    client = GraphQLClient(two_servers[0].url)
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "/stream 6 250 across processes"))["turn"]

    async def listen(server: ServerProcess) -> list[Any]:
        async with ws_session(server.ws_url) as ws:
            return [
                r["turnEvents"] async for r in ws.subscribe(request(TURN_EVENTS, t=turn["id"], a=0))
            ]

    # Both listen from the start; whichever runs the turn, one of them hears
    # every delta from the other process, through NOTIFY.
    on_a, on_b = await asyncio.wait_for(
        asyncio.gather(listen(two_servers[0]), listen(two_servers[1])), 60
    )
    done = await client.turn(turn["id"])
    assert done is not None and done["status"] == "COMPLETED"
    db = await admin(database_url)
    try:
        rows = await db.fetch(
            "SELECT seq, type FROM events WHERE turn_id = $1::uuid ORDER BY seq", turn["id"]
        )
    finally:
        await db.close()
    expected = [(r["seq"], r["type"]) for r in rows]
    assert [t for _, t in expected] == [
        "turn.started",
        "turn.running",
        *["turn.delta"] * 6,
        "turn.completed",
    ]
    elsewhere = on_b if owner_process(done, two_servers) is two_servers[0] else on_a
    for heard in (on_a, on_b):
        assert [(e["seq"], e["type"]) for e in heard] == expected
    assert (
        "".join(e["data"]["text"] for e in elsewhere if e["type"] == "turn.delta")
        == (done["output"])
    )
    await client.close()


async def test_a_server_killed_mid_stream_leaves_its_deltas_and_says_how_much(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    client = GraphQLClient(two_servers[0].url)
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "/stream 10 200"))["turn"]
    # Until three pieces are recorded, then the process running it dies.
    while True:
        now = await client.turn(turn["id"])
        assert now is not None and now["status"] in {"QUEUED", "RUNNING"}, now
        if sum(e["type"] == "turn.delta" for e in now["events"]) >= 3:
            break
        await asyncio.sleep(0.02)
    victim = owner_process(now, two_servers)
    survivor = two_servers[1] if victim is two_servers[0] else two_servers[0]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    await client.close()

    client = GraphQLClient(survivor.url)
    interrupted = await client.wait_for_status(turn["id"], {"INTERRUPTED"}, within=30)
    events = interrupted["events"]
    pieces = [e["data"] for e in events if e["type"] == "turn.delta"]
    assert 3 <= len(pieces) < 10
    assert [p["index"] for p in pieces] == list(range(len(pieces)))
    recorded = "".join(p["text"] for p in pieces)
    assert interrupted["output"] == recorded
    # What the model had said when it died: the start of its whole reply.
    whole = await FixtureModel().reply(input="/stream 10 200", mode=History.FULL, history=[])
    assert whole.startswith(recorded) and len(recorded) < len(whole)
    end = events[-1]
    assert end["type"] == "turn.interrupted"
    assert end["data"]["outputChars"] == len(recorded)
    assert end["data"]["lastEvent"]["type"] == "turn.delta"
    await client.close()
