"""A real Keyturn process SIGKILLed between a tool's intent and its result,
for a tool of each kind from a real MCP server: what the record says
afterwards, and what resolveInterruptedTurn(RETRY) does without force."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_tool_ledger import resolve, settled, turn
from tests.support import GraphQLClient, start_server_process, stop_process
from tests.support.tool_servers import effects, stdio_entry, write_tools_file

pytestmark = pytest.mark.slow

# One call of each kind, each the only call of its turn.
CALLS = {
    "READ_ONLY": ("files__lookup", {"name": "a"}),
    "REPEATABLE": ("files__put", {"name": "a", "value": "1"}),
    "IDEMPOTENT": ("files__write", {"name": "b", "value": "2"}),
    "UNSAFE": ("files__append", {"name": "c", "value": "3"}),
}


async def test_after_a_kill_between_intent_and_result_each_kind_is_treated_as_it_allows(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "effects.jsonl"
    tools = {
        "KEYTURN_TOOLS_FILE": str(write_tools_file(tmp_path / "tools.toml", stdio_entry(state)))
    }
    crashing = start_server_process(
        database_url,
        tmp_path,
        name="crashing",
        # The first three calls wait after their intent; the fourth kills.
        env={**tools, "KEYTURN_CRASH_AT": "after_intent", "KEYTURN_CRASH_AFTER": "4"},
    )
    client = GraphQLClient(crashing.url)
    turns: dict[str, str] = {}
    for kind, (tool, arguments) in CALLS.items():
        sid = await client.create_session()
        submitted = await client.submit(sid, kind, f"/call {tool} {json.dumps(arguments)}")
        turns[kind] = submitted["turn"]["id"]
    await client.close()
    assert crashing.proc.wait(30) == -signal.SIGKILL
    assert effects(state) == []  # no tool ran

    replacement = start_server_process(database_url, tmp_path, name="replacement", env=tools)
    try:
        client = GraphQLClient(replacement.url)
        calls: dict[str, dict[str, Any]] = {}
        for kind, tid in turns.items():
            [calls[kind]] = (await settled(client, tid))["toolCalls"]
        assert {kind: (c["kind"], c["state"]) for kind, c in calls.items()} == {
            "READ_ONLY": ("READ_ONLY", "OUTCOME_UNKNOWN"),
            "REPEATABLE": ("REPEATABLE", "OUTCOME_UNKNOWN"),
            # The server was asked, and settled the key as never applied.
            "IDEMPOTENT": ("IDEMPOTENT", "RECONCILED_NOT_APPLIED"),
            "UNSAFE": ("UNSAFE", "OUTCOME_UNKNOWN"),
        }
        assert effects(state) == [{"op": "settled", "key": calls["IDEMPOTENT"]["effectKey"]}]

        # Without force: a repeat-safe call runs again, a keyed one runs
        # under the retry's own key, an unsafe one is refused.
        retries: dict[str, str] = {}
        for kind in ("READ_ONLY", "REPEATABLE", "IDEMPOTENT"):
            resolved = await resolve(client, turns[kind], "RETRY", f"retry-{kind}")
            assert resolved["__typename"] == "TurnResolved", resolved
            retries[kind] = resolved["retry"]["id"]
            await client.wait_for_status(retries[kind], {"COMPLETED"})
            [again] = (await turn(client, retries[kind]))["toolCalls"]
            assert (again["state"], again["reusedFrom"]) == ("COMPLETED", None)
        refused = await resolve(client, turns["UNSAFE"], "RETRY", "retry-UNSAFE")
        assert refused["__typename"] == "UnsafeRetryRefused"
        assert (refused["index"], refused["tool"]) == (0, "files__append")

        assert [e for e in effects(state) if e["op"] != "settled"] == [
            {"op": "put", "name": "a", "value": "1"},
            {"op": "write", "key": f"{retries['IDEMPOTENT']}/0", "name": "b", "value": "2"},
        ]
        await client.close()
    finally:
        stop_process(replacement)


async def test_a_keyed_write_that_happened_before_the_kill_is_reconciled_as_applied_and_reused(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "effects.jsonl"
    tools = {
        "KEYTURN_TOOLS_FILE": str(write_tools_file(tmp_path / "tools.toml", stdio_entry(state)))
    }
    crashing = start_server_process(
        database_url, tmp_path, name="crashing", env={**tools, "KEYTURN_CRASH_AT": "after_write"}
    )
    client = GraphQLClient(crashing.url)
    sid = await client.create_session()
    tool, arguments = CALLS["IDEMPOTENT"]
    tid = (await client.submit(sid, "w", f"/call {tool} {json.dumps(arguments)}"))["turn"]["id"]
    await client.close()
    assert crashing.proc.wait(30) == -signal.SIGKILL

    replacement = start_server_process(database_url, tmp_path, name="replacement", env=tools)
    try:
        client = GraphQLClient(replacement.url)
        [call] = (await settled(client, tid))["toolCalls"]
        assert call["state"] == "RECONCILED_APPLIED"
        resolved = await resolve(client, tid, "RETRY", "retry")
        assert resolved["__typename"] == "TurnResolved", resolved
        new = resolved["retry"]["id"]
        await client.wait_for_status(new, {"COMPLETED"})
        [again] = (await turn(client, new))["toolCalls"]
        assert (again["state"], again["reusedFrom"]) == ("COMPLETED", tid)
        # Applied once, under the interrupted turn's key; the retry did not run it.
        assert [e for e in effects(state) if e["op"] == "write"] == [
            {"op": "write", "key": f"{tid}/0", "name": "b", "value": "2"}
        ]
        await client.close()
    finally:
        stop_process(replacement)
