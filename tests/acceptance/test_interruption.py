"""Real processes killed, and turns cancelled, in the middle of tool calls:
the experiment, and resolving what a kill left."""

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
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contradictions in all: 0; broken cancels or retries: 0" in done.stdout
    assert "12/12 turns settled" in done.stderr  # the progress line
    assert "12/12 cancels recorded" in done.stderr
    assert "4/4 retries sent, the answers held" in done.stderr
    summary: dict[str, Any] = json.loads(out.read_text())
    assert summary["contradictions"] == 0
    rows = {(r["point"], r["tool"]): r for r in summary["rows"]}
    # What the record says of the second call, and what the store says, for
    # each crash point and tool (the builtin ones, and the MCP server's).
    said = {
        "before_intent": {
            "synthetic_write": ("NOT_STARTED", "not applied"),
            "synthetic_append": ("NOT_STARTED", "not applied"),
            "store__read": ("NOT_STARTED", "unchanged"),
            "store__set": ("NOT_STARTED", "not set"),
            "store__write": ("NOT_STARTED", "not applied"),
            "store__append": ("NOT_STARTED", "not applied"),
        },
        # Between intent and result the record cannot know; the idempotent
        # tools are asked, and the answer is the store's.
        "after_intent": {
            "synthetic_write": ("RECONCILED_NOT_APPLIED", "not applied"),
            "synthetic_append": ("OUTCOME_UNKNOWN", "not applied"),
            "store__read": ("OUTCOME_UNKNOWN", "unchanged"),
            "store__set": ("OUTCOME_UNKNOWN", "not set"),
            "store__write": ("RECONCILED_NOT_APPLIED", "not applied"),
            "store__append": ("OUTCOME_UNKNOWN", "not applied"),
        },
        "after_write": {
            "synthetic_write": ("RECONCILED_APPLIED", "applied once"),
            "synthetic_append": ("OUTCOME_UNKNOWN", "applied once"),
            "store__read": ("OUTCOME_UNKNOWN", "unchanged"),
            "store__set": ("OUTCOME_UNKNOWN", "set"),
            "store__write": ("RECONCILED_APPLIED", "applied once"),
            "store__append": ("OUTCOME_UNKNOWN", "applied once"),
        },
    }
    done_once = {
        "synthetic_write": ("COMPLETED", "applied once"),
        "synthetic_append": ("COMPLETED", "applied once"),
        "store__read": ("COMPLETED", "unchanged"),
        "store__set": ("COMPLETED", "set"),
        "store__write": ("COMPLETED", "applied once"),
        "store__append": ("COMPLETED", "applied once"),
    }
    # Cancelled while the call was held in flight: it finished, and its
    # effect is in the store once.
    said["after_result"] = said["cancelled mid-tool"] = said["none"] = done_once
    kinds = {
        "synthetic_write": "IDEMPOTENT",
        "synthetic_append": "UNSAFE",
        "store__read": "READ_ONLY",
        "store__set": "REPEATABLE",
        "store__write": "IDEMPOTENT",
        "store__append": "UNSAFE",
    }
    # A RETRY sent while the replacement's answer about the cut call was
    # held (the store had answered, the record did not say so yet): the
    # earlier call settled first, then the retry reused the applied effect
    # or applied it under its own key, once in the store either way.
    said["retry racing reconciliation (after_write)"] = {
        tool: ("RECONCILED_APPLIED then COMPLETED", "applied once")
        for tool in ("synthetic_write", "store__write")
    }
    said["retry racing reconciliation (after_intent)"] = {
        tool: ("RECONCILED_NOT_APPLIED then COMPLETED", "applied once")
        for tool in ("synthetic_write", "store__write")
    }
    assert set(rows) == {(point, tool) for point, tools in said.items() for tool in tools}
    for point, tools in said.items():
        for tool, (record, store_says) in tools.items():
            row = rows[(point, tool)]
            assert row["kind"] == kinds[tool], row
            assert row["record"] == {record: 2}, (point, tool, row)
            assert row["store"] == {store_says: 2}, (point, tool, row)
            assert row["contradicted"] == row["broken"] == 0, row
    # OUTCOME_UNKNOWN exactly where the crash fell between intent and result
    # of a tool nobody can ask.
    unknown = {
        (o["point"], o["tool"])
        for o in summary["observations"]
        for c in o["calls"]
        if c["record"] == "OUTCOME_UNKNOWN"
    }
    assert unknown == {
        (point, tool)
        for point in ("after_intent", "after_write")
        for tool in ("synthetic_append", "store__read", "store__set", "store__append")
    }
    # 72 in the rows above; 4 in the after-write racing turns (call 0), 12 in
    # the after-intent ones (calls 0 to 2).
    assert summary["earlierCalls"] == {"agreed": 88}
    raced = [o for o in summary["observations"] if o["point"].startswith("retry racing")]
    assert len(raced) == 8
    for o in raced:
        assert o["race"] == {"contradicts": [], "broken": []}, o
        assert o["retry"]["status"] == "COMPLETED", o
        cut = o["calls"][o["cut"]]
        # Under its own key when the earlier one was settled as never applied.
        own = o["point"].endswith("(after_intent)")
        assert cut["retry"]["effectKey"] == (
            f"{o['retry']['turnId']}/{o['cut']}" if own else cut["effectKey"]
        ), o
    # In every cancelled turn the call in flight finished with its result,
    # the call after it did not start, and the end says so.
    cancelled = [o for o in summary["observations"] if o["point"] == "cancelled mid-tool"]
    assert len(cancelled) == 12
    for o in cancelled:
        assert o["status"] == "CANCELLED", o
        assert [c["record"] for c in o["calls"]] == ["COMPLETED", "COMPLETED", "NOT_STARTED"], o
        assert o["cancel"] == {"contradicts": [], "broken": []}, o
    assert summary["laterCalls"] == {"agreed": 12}
    assert summary["broken"] == 0


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
