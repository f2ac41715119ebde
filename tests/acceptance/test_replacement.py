"""A replacement process on the same database finds everything the old one left."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support import GraphQLClient, start_server_process, stop_process

pytestmark = pytest.mark.slow


async def test_replacement_after_a_clean_stop_finds_everything_and_runs_what_was_queued(
    database_url: str, tmp_path: Path, db: Any
) -> None:
    old = start_server_process(
        database_url,
        tmp_path,
        name="old",
        env={"KEYTURN_SHUTDOWN_GRACE_S": "0.5", "KEYTURN_LOG_LEVEL": "info"},
    )
    client = GraphQLClient(old.url)
    sid = await client.create_session()
    long = await client.submit(sid, "long", "/sleep 5000 a long one")
    queued = [await client.submit(sid, f"q{n}", f"queued {n}") for n in range(3)]
    await client.wait_for_status(long["turn"]["id"], {"RUNNING"})
    await client.close()
    stop_process(old)  # SIGTERM: the running turn is handed back, not interrupted
    # uvicorn re-raises the SIGTERM it handled once shutdown is done
    assert old.proc.returncode in (0, -signal.SIGTERM), old.log()
    assert "handed back to the queue" in old.log()
    row = await db.fetchrow(
        "SELECT status, owner FROM turns WHERE id = $1::uuid", long["turn"]["id"]
    )
    assert row["status"] == "QUEUED" and row["owner"] is None

    new = start_server_process(database_url, tmp_path, name="new")
    try:
        client = GraphQLClient(new.url)
        session = await client.session(sid)
        assert session["id"] == sid
        retried = await client.submit(sid, "q1", "queued 1")
        assert retried["__typename"] == "TurnReplayed"
        assert retried["turn"]["id"] == queued[1]["turn"]["id"]
        for t in [long, *queued]:
            done = await client.wait_for_status(t["turn"]["id"], {"COMPLETED"})
            assert done["status"] == "COMPLETED"
        seen = await client.turn(long["turn"]["id"])
        assert seen is not None
        types = [e["type"] for e in seen["events"]]
        assert types == [
            "turn.started",
            "turn.running",
            "turn.released",
            "turn.running",
            "turn.delta",
            "turn.completed",
        ]
        await client.close()
    finally:
        stop_process(new)


async def test_a_turn_left_running_by_a_killed_process_never_runs_twice(
    database_url: str, tmp_path: Path
) -> None:
    old = start_server_process(database_url, tmp_path, name="old")
    client = GraphQLClient(old.url)
    sid = await client.create_session()
    running = await client.submit(sid, "r", "/sleep 8000 interrupted")
    after = await client.submit(sid, "a", "after the crash")
    await client.wait_for_status(running["turn"]["id"], {"RUNNING"})
    await client.close()
    old.proc.send_signal(signal.SIGKILL)
    old.proc.wait()

    new = start_server_process(database_url, tmp_path, name="new")
    try:
        client = GraphQLClient(new.url)
        # lease TTL is 3 s in tests; the new process notices within TTL + poll
        turn = await client.wait_for_status(running["turn"]["id"], {"INTERRUPTED"}, within=15)
        types = [e["type"] for e in turn["events"]]
        assert types == ["turn.started", "turn.running", "turn.interrupted"]
        interrupted = turn["events"][-1]["data"]
        assert interrupted["epoch"] == 1
        assert interrupted["lastEvent"]["type"] == "turn.running"
        assert interrupted["owner"] == turn["owner"]
        replay = await client.submit(sid, "r", "/sleep 8000 interrupted")
        assert replay["__typename"] == "TurnReplayed"
        assert replay["turn"]["status"] == "INTERRUPTED"
        nxt = await client.wait_for_status(after["turn"]["id"], {"COMPLETED"})
        assert "1. /sleep 8000 interrupted [interrupted]" in nxt["output"]
        await client.close()
    finally:
        stop_process(new)


async def test_a_clean_stop_does_not_hand_back_a_turn_whose_tool_ran(
    database_url: str, tmp_path: Path, db: Any
) -> None:
    """A turn that has acted outside itself is never run again on its own: a
    clean stop leaves it to its lease, and it ends INTERRUPTED with what the
    record establishes about its tool call."""
    old = start_server_process(
        database_url,
        tmp_path,
        name="old",
        env={"KEYTURN_SHUTDOWN_GRACE_S": "0.5", "KEYTURN_LOG_LEVEL": "info"},
    )
    client = GraphQLClient(old.url)
    sid = await client.create_session()
    turn = (await client.submit(sid, "t", "/sleep 6000 /write colour=blue"))["turn"]
    for _ in range(200):
        seen = await client.turn(turn["id"])
        assert seen is not None
        types = [e["type"] for e in seen["events"]]
        if "tool.result" in types:
            break
        await asyncio.sleep(0.05)
    await client.close()
    stop_process(old)  # SIGTERM while the reply is still being written
    assert "turn.released" not in [
        r["type"]
        for r in await db.fetch("SELECT type FROM events WHERE turn_id = $1::uuid", turn["id"])
    ]
    new = start_server_process(database_url, tmp_path, name="new")
    try:
        client = GraphQLClient(new.url)
        ended = await client.wait_for_status(turn["id"], {"INTERRUPTED", "COMPLETED"}, within=20)
        assert ended["status"] == "INTERRUPTED"
        data = await client.execute(
            "query($id: ID!) { turn(id: $id) { toolCalls { index tool state effectKey } } }",
            {"id": turn["id"]},
        )
        [call] = data["turn"]["toolCalls"]
        assert (call["tool"], call["state"]) == ("synthetic_write", "COMPLETED")
        applied = await db.fetchval(
            "SELECT count(*) FROM synthetic_effects WHERE effect_key = $1 AND applied",
            call["effectKey"],
        )
        assert applied == 1
        await client.close()
    finally:
        stop_process(new)


async def test_a_clean_stop_does_not_hand_back_a_turn_that_has_streamed(
    database_url: str, tmp_path: Path, db: Any
) -> None:
    """Run again, a streamed turn would record a second reply beside the
    first: it is interrupted with the text it recorded, which stays its output."""
    old = start_server_process(
        database_url,
        tmp_path,
        name="old",
        env={"KEYTURN_SHUTDOWN_GRACE_S": "0.5", "KEYTURN_DELTA_FLUSH_MS": "20"},
    )
    client = GraphQLClient(old.url)
    sid = await client.create_session()
    turn = (await client.submit(sid, "s", "/stream 20 300 stopped mid-stream"))["turn"]
    for _ in range(400):
        seen = await client.turn(turn["id"])
        assert seen is not None
        if sum(e["type"] == "turn.delta" for e in seen["events"]) >= 2:
            break
        await asyncio.sleep(0.05)
    await client.close()
    stop_process(old)  # SIGTERM mid-stream, past its grace
    new = start_server_process(database_url, tmp_path, name="new")
    try:
        client = GraphQLClient(new.url)
        ended = await client.wait_for_status(turn["id"], {"INTERRUPTED", "COMPLETED"}, within=20)
        assert ended["status"] == "INTERRUPTED"
        types = [e["type"] for e in ended["events"]]
        assert "turn.released" not in types and types.count("turn.running") == 1
        pieces = [e["data"]["text"] for e in ended["events"] if e["type"] == "turn.delta"]
        assert 2 <= len(pieces) < 20
        assert "".join(pieces) == ended["output"]
        assert ended["events"][-1]["data"]["outputChars"] == len(ended["output"])
        await client.close()
    finally:
        stop_process(new)
