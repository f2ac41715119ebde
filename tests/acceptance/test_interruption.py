"""Real processes killed in the middle of tool calls: the experiment, and
resolving what they left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_tool_ledger import resolve, settled, store, turn
from tests.support import ROOT, GraphQLClient, start_server_process, stop_process

pytestmark = pytest.mark.slow


def test_the_interruption_experiment_finds_no_contradiction(
    server_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "observation.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYTURN_")}
    env["KEYTURN_DATABASE_URL"] = server_url  # a throwaway database on the tests' server
    command = ["experiment", "interruption", "--runs", "2", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "keyturn", *command],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "crash point" in done.stdout and "Contradictions in all: 0" in done.stdout
    assert "4/4 turns settled" in done.stderr  # the progress line
    summary: dict[str, Any] = json.loads(out.read_text())
    assert summary["contradictions"] == 0
    rows = {(r["point"], r["kind"]): r for r in summary["rows"]}
    expected = {
        ("before_intent", "IDEMPOTENT"): ("NOT_STARTED", "not applied"),
        ("before_intent", "UNSAFE"): ("NOT_STARTED", "not applied"),
        # Between intent and result the record cannot know; the idempotent
        # tool is asked, and the answer is the store's.
        ("after_intent", "IDEMPOTENT"): ("RECONCILED_NOT_APPLIED", "not applied"),
        ("after_intent", "UNSAFE"): ("OUTCOME_UNKNOWN", "not applied"),
        ("after_write", "IDEMPOTENT"): ("RECONCILED_APPLIED", "applied once"),
        ("after_write", "UNSAFE"): ("OUTCOME_UNKNOWN", "applied once"),
        ("after_result", "IDEMPOTENT"): ("COMPLETED", "applied once"),
        ("after_result", "UNSAFE"): ("COMPLETED", "applied once"),
        ("none", "IDEMPOTENT"): ("COMPLETED", "applied once"),
        ("none", "UNSAFE"): ("COMPLETED", "applied once"),
    }
    for where, (record, store_says) in expected.items():
        assert rows[where]["record"] == {record: 2}, (where, rows[where])
        assert rows[where]["store"] == {store_says: 2}, (where, rows[where])
    # OUTCOME_UNKNOWN exactly where the crash fell between intent and result.
    unknown = {
        (o["point"], o["kind"])
        for o in summary["observations"]
        for c in o["calls"]
        if c["record"] == "OUTCOME_UNKNOWN"
    }
    assert unknown == {("after_intent", "UNSAFE"), ("after_write", "UNSAFE")}
    assert summary["earlierCalls"] == {"agreed": 20}


async def test_a_retry_after_a_real_kill_reuses_results_and_refuses_an_unknown_unsafe_call(
    database_url: str, tmp_path: Path, db: Any
) -> None:
    crashing = start_server_process(
        database_url,
        tmp_path,
        name="crashing",
        env={"KEYTURN_CRASH_AT": "after_write:1", "KEYTURN_CRASH_AFTER": "2"},
    )
    client = GraphQLClient(crashing.url)
    w_sid = await client.create_session()
    w = (await client.submit(w_sid, "w", "/write a=1 /write b=2"))["turn"]["id"]
    u_sid = await client.create_session()
    u = (await client.submit(u_sid, "u", "/append a=1 /append b=2"))["turn"]["id"]
    await client.close()
    assert crashing.proc.wait(30) == -signal.SIGKILL

    replacement = start_server_process(database_url, tmp_path, name="replacement")
    try:
        client = GraphQLClient(replacement.url)
        assert [c["state"] for c in (await settled(client, w))["toolCalls"]] == [
            "COMPLETED",
            "RECONCILED_APPLIED",
        ]
        assert [c["state"] for c in (await settled(client, u))["toolCalls"]] == [
            "COMPLETED",
            "OUTCOME_UNKNOWN",
        ]

        first = await resolve(client, w, "RETRY", "retry-w")
        again = await resolve(client, w, "RETRY", "retry-w")
        assert first["__typename"] == again["__typename"] == "TurnResolved"
        assert again["replayed"] and again["retry"]["id"] == first["retry"]["id"]
        new = first["retry"]["id"]
        await client.wait_for_status(new, {"COMPLETED"})
        assert [c["reusedFrom"] for c in (await turn(client, new))["toolCalls"]] == [w, w]
        # Each effect happened once, whatever the crash and the retry.
        for n in (0, 1):
            assert [r["applied"] for r in await store(db, f"{w}/{n}")] == [True]
        assert await db.fetchval("SELECT count(*) FROM synthetic_effects WHERE applied") == 4

        refused = await resolve(client, u, "RETRY", "retry-u")
        assert refused["__typename"] == "UnsafeRetryRefused"
        assert (refused["index"], refused["tool"]) == (1, "synthetic_append")
        abandoned = await resolve(client, u, "ABANDON", "abandon-u")
        assert abandoned["__typename"] == "TurnResolved"
        assert [e["type"] for e in (await turn(client, u))["events"]][-1] == "turn.abandoned"
        await client.close()
    finally:
        stop_process(replacement)
