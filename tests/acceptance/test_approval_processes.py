"""Approval across real processes: a turn that waits survives the death of
every process, and a new one runs the approved call once."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_approval import decide, store, turn, waiting
from tests.support import GraphQLClient, start_server_process, stop_process

pytestmark = pytest.mark.slow

APPROVING = {"KEYTURN_APPROVE_UNSAFE": "true"}


async def test_a_waiting_turn_outlives_a_killed_process_and_runs_once_approved(
    database_url: str, tmp_path: Path, db: Any
) -> None:
    first = start_server_process(database_url, tmp_path, name="first", env=APPROVING)
    client = GraphQLClient(first.url)
    try:
        sid = await client.create_session()
        tid = (await client.submit(sid, "k", "/write a=1 /append b=2 /read a"))["turn"]["id"]
        await waiting(client, tid)
    finally:
        await client.close()
        first.proc.send_signal(signal.SIGKILL)
    assert first.proc.wait(30) == -signal.SIGKILL

    second = start_server_process(database_url, tmp_path, name="second", env=APPROVING)
    try:
        client = GraphQLClient(second.url)
        # Nothing interrupts it: a waiting turn has no lease to run out.
        t = await turn(client, tid)
        assert t["status"] == "WAITING"
        assert [c["state"] for c in t["toolCalls"]] == [
            "COMPLETED",
            "AWAITING_APPROVAL",
            "NOT_STARTED",
        ]
        decided = await decide(client, tid, 1, "APPROVE", "go")
        assert decided["__typename"] == "ToolCallDecided"
        done = await client.wait_for_status(tid, {"COMPLETED"})
        assert done["epoch"] == 2
        t = await turn(client, tid)
        runs = [
            (e["data"]["epoch"], e["data"]["owner"])
            for e in t["events"]
            if e["type"] == "turn.running"
        ]
        # Claimed again by the new process, under a new epoch.
        assert [epoch for epoch, _ in runs] == [1, 2]
        assert runs[0][1] != runs[1][1]
        assert [c["state"] for c in t["toolCalls"]] == ["COMPLETED"] * 3
        for n in (0, 1):
            assert len(await store(db, f"{tid}/{n}")) == 1
        await client.close()
    finally:
        stop_process(second)
