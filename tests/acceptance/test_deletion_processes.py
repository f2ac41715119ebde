"""deleteSession across real processes: a session deleted through one server
closes the live subscribers another server holds, with the reason they get
when both are one process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_deletion import TURN_EVENTS, delete, follow
from tests.support import (
    SESSION_EVENTS,
    TURN_COMPLETED,
    GraphQLClient,
    ServerProcess,
    request,
    two_server_processes,
    ws_session,
)

pytestmark = pytest.mark.slow

# One running turn per process: with a turn of another session holding each,
# the deleted session's turn stays QUEUED and its end is never seen (as a
# drained worker leaves it in the one-process test). The subscribers'
# safety-net poll is a minute, longer than any wait here: a subscriber closed
# in time heard of the deletion through the other process's wake-up.
POLL_S = 60
WITHIN_S = 20  # well inside POLL_S
ENV = {"KEYTURN_MAX_RUNNING_TURNS": "1", "KEYTURN_SUBSCRIPTION_POLL_S": str(POLL_S)}


@pytest.fixture
def two_servers(database_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with two_server_processes(database_url, tmp_path, ENV) as servers:
        yield servers


async def open_subscriptions(server: ServerProcess) -> float:
    """keyturn_subscriptions_open as the process's /metrics says it now."""
    async with httpx.AsyncClient(base_url=server.url) as http:
        text = (await http.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "keyturn_subscriptions_open":
                return float(sample.value)
    raise AssertionError("no keyturn_subscriptions_open in /metrics")


async def until_open(server: ServerProcess, n: int) -> None:
    async with asyncio.timeout(WITHIN_S):
        while await open_subscriptions(server) != n:  # noqa: ASYNC110 - a scrape, not an event
            await asyncio.sleep(0.1)


async def test_a_deletion_on_one_process_closes_the_subscribers_of_another_with_the_reason(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = two_servers
    client = GraphQLClient(a.url)
    try:
        # A turn that holds each process's only running slot (for minutes,
        # with a safe point to stop at every half second).
        holders = []
        for _ in range(2):
            sid = await client.create_session()
            tid = (await client.submit(sid, "hold", "/stream 1000 500 holding"))["turn"]["id"]
            await client.wait_for_status(tid, {"RUNNING"})
            holders.append(sid)
        sid = await client.create_session()
        tid = (await client.submit(sid, "k", "waits"))["turn"]["id"]
        queued = await client.turn(tid)
        assert queued is not None and queued["status"] == "QUEUED", queued

        seen: list[dict[str, Any]] = []
        turn_seen: list[dict[str, Any]] = []
        errors: dict[str, Any] = {}
        async with ws_session(b.ws_url) as ws:
            tasks = [
                asyncio.create_task(follow(ws, req, field, into, errors, name))
                for req, field, into, name in (
                    (request(SESSION_EVENTS, s=sid, a=0), "sessionEvents", seen, "events"),
                    (request(TURN_COMPLETED, t=tid), "turnCompleted", [], "ended"),
                    (request(TURN_EVENTS, t=tid, a=0), "turnEvents", turn_seen, "turn"),
                )
            ]
            # All three registered on b (its /metrics says so), the first
            # event seen by both event streams.
            async with asyncio.timeout(WITHIN_S):
                while not (seen and turn_seen):  # noqa: ASYNC110 - the subscribers have read it
                    await asyncio.sleep(0.02)
            await until_open(b, 3)
            assert await open_subscriptions(a) == 0

            assert (await delete(client, sid, "bye"))["__typename"] == "SessionDeleted"
            async with asyncio.timeout(WITHIN_S):
                await asyncio.gather(*tasks)
        assert [e["type"] for e in seen] == [e["type"] for e in turn_seen] == ["turn.started"]
        for name in ("events", "ended", "turn"):
            assert errors[name]["message"] == f"session {sid} was deleted", errors
            assert errors[name]["extensions"] == {"code": "NOT_FOUND", "retryable": False}
        # And b let them go.
        await until_open(b, 0)

        # The holders go too (their turns stopped at a safe point), so the
        # servers stop at once.
        for n, holder in enumerate(holders):
            assert (await delete(client, holder, f"done-{n}"))["__typename"] == "SessionDeleted"
    finally:
        await client.close()
