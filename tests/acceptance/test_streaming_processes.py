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
# piece the fixture streams is a delta of its own. The subscribers' safety-net
# poll is a minute, longer than any wait here: an event that reaches the other
# process in time came through its NOTIFY wake-up, not through the poll.
POLL_S = 60
STREAMING = {"KEYTURN_DELTA_FLUSH_MS": "20", "KEYTURN_SUBSCRIPTION_POLL_S": str(POLL_S)}
WITHIN_S = 20  # well inside POLL_S


@pytest.fixture
def two_servers(database_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with two_server_processes(database_url, tmp_path, STREAMING) as servers:
        yield servers


async def _recorded(database_url: str, turn_id: str) -> list[tuple[int, str]]:
    db = await admin(database_url)
    try:
        rows = await db.fetch(
            "SELECT seq, type FROM events WHERE turn_id = $1::uuid ORDER BY seq", turn_id
        )
    finally:
        await db.close()
    return [(r["seq"], r["type"]) for r in rows]


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
        asyncio.gather(listen(two_servers[0]), listen(two_servers[1])), WITHIN_S
    )
    done = await client.turn(turn["id"])
    assert done is not None and done["status"] == "COMPLETED"
    expected = await _recorded(database_url, turn["id"])
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


async def test_a_subscriber_on_the_other_process_resumes_mid_stream_from_after_seq(
    two_servers: tuple[ServerProcess, ServerProcess], database_url: str
) -> None:
    client = GraphQLClient(two_servers[0].url)
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "/stream 8 300 resumed elsewhere"))["turn"]
    running = await client.wait_for_status(turn["id"], {"RUNNING"}, within=WITHIN_S)
    owner = owner_process(running, two_servers)
    other = two_servers[1] if owner is two_servers[0] else two_servers[0]

    # On the process that does not run the turn: two deltas, then the
    # connection is dropped, as a reload or a lost network drops it.
    first: list[Any] = []
    async with ws_session(other.ws_url) as ws:
        async for r in ws.subscribe(request(TURN_EVENTS, t=turn["id"], a=0)):
            first.append(r["turnEvents"])
            if sum(e["type"] == "turn.delta" for e in first) == 2:
                break
    assert first[-1]["type"] == "turn.delta"

    async def rest() -> list[Any]:
        async with ws_session(other.ws_url) as ws:
            after = request(TURN_EVENTS, t=turn["id"], a=first[-1]["seq"])
            return [r["turnEvents"] async for r in ws.subscribe(after)]

    second = await asyncio.wait_for(rest(), WITHIN_S)
    heard = [(e["seq"], e["type"]) for e in first + second]
    expected = await _recorded(database_url, turn["id"])
    # Resumed from its cursor: every event once, in seq order, to the end.
    assert heard == expected
    assert expected[-1][1] == "turn.completed"
    assert sum(t == "turn.delta" for _, t in expected) == 8
    done = await client.turn(turn["id"])
    assert done is not None
    texts = [e["data"]["text"] for e in first + second if e["type"] == "turn.delta"]
    assert "".join(texts) == done["output"]
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
