"""cancelTurn across real server processes: a cancel sent to one process stops
a turn another one runs, by a wake-up; a process that dies after the request
leaves the turn INTERRUPTED with the request in its record."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cancel import cancel, deltas_of, ended, turn
from tests.support import GraphQLClient, ServerProcess, owner_process, two_server_processes

pytestmark = pytest.mark.slow

# The lease renewal also tells a process of a cancel; renewing only every
# 10 s leaves the wake-up (NOTIFY) as the only way one can arrive in time.
SLOW_RENEWAL = {"KEYTURN_LEASE_TTL_S": "30", "KEYTURN_LEASE_RENEW_S": "10"}


@pytest.fixture
def slow_renewal(database_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, ...]]:
    with two_server_processes(database_url, tmp_path, SLOW_RENEWAL) as servers:
        yield servers


@pytest.fixture
def two_servers(database_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, ...]]:
    with two_server_processes(database_url, tmp_path) as servers:
        yield servers


async def running(client: GraphQLClient, turn_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        t = await client.turn(turn_id)
        assert t is not None
        if t["status"] == "RUNNING":
            return t
        assert time.monotonic() < deadline, t
        await asyncio.sleep(0.02)


async def test_a_cancel_sent_to_one_process_stops_a_stream_running_on_another(
    slow_renewal: tuple[ServerProcess, ServerProcess],
) -> None:
    clients = [GraphQLClient(s.url) for s in slow_renewal]
    try:
        sid = await clients[0].create_session()
        tid = (await clients[0].submit(sid, "s", "/stream 20 200"))["turn"]["id"]
        owner = owner_process(await running(clients[0], tid), slow_renewal)
        other = clients[1] if owner is slow_renewal[0] else clients[0]
        answer = await cancel(other, tid, "stop", reason="from the other process")
        assert answer["__typename"] == "TurnCancellation", answer
        t = await ended(other, tid)
        assert t["status"] == "CANCELLED"
        types = [e["type"] for e in t["events"]]
        assert types[-1] == "turn.cancelled" and "turn.completed" not in types
        # Stopped before the stream's 20 pieces (4 s), long before any renewal.
        assert types.count("turn.delta") < 20
        assert t["output"] == deltas_of(await turn(other, tid))
    finally:
        for c in clients:
            await c.close()


async def test_a_process_that_dies_after_the_request_leaves_it_interrupted_with_the_request(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    clients = [GraphQLClient(s.url) for s in two_servers]
    try:
        sid = await clients[0].create_session()
        tid = (await clients[0].submit(sid, "s", "/sleep 8000"))["turn"]["id"]
        owner = owner_process(await running(clients[0], tid), two_servers)
        survivor = clients[1] if owner is two_servers[0] else clients[0]
        answer = await cancel(survivor, tid, "stop")
        assert answer["turn"]["status"] == "RUNNING"
        assert answer["turn"]["cancelRequested"] is True
        # The fixture model holds the turn with no safe point until it
        # replies: it dies before it can stop there.
        os.kill(owner.proc.pid, signal.SIGKILL)
        owner.proc.wait(10)
        t = await ended(survivor, tid, within=30)
        assert t["status"] == "INTERRUPTED"
        types = [e["type"] for e in t["events"]]
        assert "turn.cancel_requested" in types
        assert types[-1] == "turn.interrupted"
        assert "turn.cancelled" not in types
        assert (await turn(survivor, tid))["cancelRequested"] is True
    finally:
        for c in clients:
            await c.close()
