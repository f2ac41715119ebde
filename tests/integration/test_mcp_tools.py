"""Tools from real MCP servers (tests/support/mcp_server.py, FastMCP) over stdio
and streamable HTTP, called through Keyturn's API with the fixture's ``/call``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_tool_ledger import resolve, settled, take_over, turn
from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process
from tests.support.tool_servers import (
    OVERRIDES,
    effects,
    http_entry,
    http_mcp_server,
    stdio_entry,
    write_tools_file,
)

TOOLS = "{ tools { name kind source description } }"


def call(tool: str, arguments: dict[str, Any] | None = None) -> str:
    return f"/call {tool} {json.dumps(arguments or {})}"


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "effects.jsonl"


@pytest.fixture(params=["stdio", "http"])
def tools_file(request: Any, tmp_path: Path, state: Path) -> Iterator[Path]:
    if request.param == "stdio":
        yield write_tools_file(tmp_path / "tools.toml", stdio_entry(state))
    else:
        with http_mcp_server(state, tmp_path) as url:
            yield write_tools_file(tmp_path / "tools.toml", http_entry(url))


@pytest.fixture
def stdio_tools_file(tmp_path: Path, state: Path) -> Path:
    return write_tools_file(tmp_path / "tools.toml", stdio_entry(state))


def serving(
    database_url: str, tools_file: Path, **settings: Any
) -> contextlib.AbstractAsyncContextManager[InProcessServer]:
    return serve_in_process(database_url, fast_settings(tools_file=tools_file, **settings))


@pytest.fixture
async def client(database_url: str, tools_file: Path) -> AsyncIterator[GraphQLClient]:
    async with serving(database_url, tools_file) as srv:
        c = GraphQLClient(srv.url)
        yield c
        await c.close()


async def run(client: GraphQLClient, input: str, status: str = "COMPLETED") -> dict[str, Any]:
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", input))["turn"]["id"]
    await client.wait_for_status(tid, {status})
    return await turn(client, tid)


async def test_tools_get_the_kind_their_annotations_say_and_the_file_overrides_win(
    client: GraphQLClient,
) -> None:
    listed = {t["name"]: t for t in (await client.execute(TOOLS))["tools"]}
    kinds = {name: t["kind"] for name, t in listed.items() if t["source"] == "mcp:files"}
    assert kinds == {
        "files__lookup": "READ_ONLY",  # readOnlyHint
        "files__put": "REPEATABLE",  # idempotentHint
        "files__append": "UNSAFE",  # no hints: MCP's defaults
        "files__remove": "UNSAFE",  # idempotentHint, overridden by the file
        "files__echo": "READ_ONLY",  # no hints, overridden by the file
        "files__write": "IDEMPOTENT",  # the file says how to key it and ask
        "files__was_applied": "READ_ONLY",
        "files__fail": "UNSAFE",
        "files__hang": "UNSAFE",
        "files__slow_lookup": "READ_ONLY",
        "files__crash": "UNSAFE",
        "files__crash_lookup": "READ_ONLY",
        "files__pid": "READ_ONLY",
        "files__reject": "UNSAFE",
        "files__slow_write": "UNSAFE",
        "files__flaky_was_applied": "READ_ONLY",
    }
    # files__file.stat is listed by the server but not offered: its dot is not
    # allowed in a function name by the model APIs.
    assert "files__file.stat" not in listed
    assert listed["files__lookup"]["description"] == "The latest value under NAME."
    assert listed["synthetic_write"]["source"] == "builtin"
    assert listed["synthetic_write"]["kind"] == "IDEMPOTENT"


async def test_calls_run_with_their_arguments_and_the_idempotent_one_gets_the_effect_key(
    client: GraphQLClient, state: Path
) -> None:
    t = await run(
        client,
        " ".join(
            [
                call("files__put", {"name": "a", "value": "1"}),
                call("files__lookup", {"name": "a"}),
                call("files__write", {"name": "b", "value": "2"}),
            ]
        ),
    )
    assert [(c["tool"], c["kind"], c["state"]) for c in t["toolCalls"]] == [
        ("files__put", "REPEATABLE", "COMPLETED"),
        ("files__lookup", "READ_ONLY", "COMPLETED"),
        ("files__write", "IDEMPOTENT", "COMPLETED"),
    ]
    lookup = t["toolCalls"][1]["result"]
    assert lookup == {"structuredContent": {"name": "a", "value": "1"}}
    # The model was shown what the tool returned.
    assert (
        'tool 1 files__lookup {"name": "a"}: ' + json.dumps(lookup, sort_keys=True) in (t["output"])
    )
    write = t["toolCalls"][2]
    assert write["arguments"] == {"name": "b", "value": "2"}
    assert [e for e in effects(state) if e["op"] == "write"] == [
        {"op": "write", "key": write["effectKey"], "name": "b", "value": "2"}
    ]


async def test_an_error_result_is_recorded_and_shown_and_the_turn_completes(
    client: GraphQLClient,
) -> None:
    t = await run(client, call("files__fail", {"reason": "not today"}))
    [failed] = t["toolCalls"]
    assert failed["state"] == "COMPLETED"
    assert "refused: not today" in failed["result"]["error"]
    assert failed["result"]["content"][0]["type"] == "text"
    assert "refused: not today" in t["output"]


async def test_a_call_of_a_tool_nobody_offers_is_an_error_result(client: GraphQLClient) -> None:
    t = await run(client, call("files__nothing"))
    assert t["toolCalls"][0]["result"] == {"error": "no tool named 'files__nothing'"}


async def test_arguments_that_are_not_a_json_object_fail_the_turn(client: GraphQLClient) -> None:
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", '/call files__lookup {"name": a}'))["turn"]["id"]
    failed = await client.wait_for_status(tid, {"FAILED"})
    assert failed["error"].startswith("/call files__lookup: the arguments are not valid JSON")
    t = await turn(client, tid)
    assert t["toolCalls"] == []


def shown(t: dict[str, Any], index: int) -> str:
    """The line in which the fixture model repeats what it was shown of a call."""
    c = t["toolCalls"][index]
    arguments = json.dumps(c["arguments"], sort_keys=True)
    return f"tool {index} {c['tool']} {arguments}: {json.dumps(c['result'], sort_keys=True)}"


def result_event(t: dict[str, Any], index: int) -> dict[str, Any]:
    found: dict[str, Any]
    [found] = [
        e["data"] for e in t["events"] if e["type"] == "tool.result" and e["data"]["index"] == index
    ]
    return found


async def test_past_the_timeout_a_read_is_an_error_and_a_write_is_unknown_and_the_turn_goes_on(
    database_url: str, stdio_tools_file: Path
) -> None:
    async with serving(database_url, stdio_tools_file, tool_timeout_s=1.0) as srv:
        client = GraphQLClient(srv.url)
        read = await run(client, call("files__slow_lookup", {"seconds": 30}))
        assert read["toolCalls"][0]["state"] == "COMPLETED"
        assert read["toolCalls"][0]["result"] == {
            "error": "files__slow_lookup did not answer within 1s (KEYTURN_TOOL_TIMEOUT_S)"
        }
        # A write that did not answer may still be at work: its effect is
        # unknown, the model is told so, and the turn goes on to its next call.
        t = await run(
            client,
            call("files__hang", {"seconds": 30}) + " " + call("files__echo", {"text": "next"}),
        )
        assert [(c["kind"], c["state"]) for c in t["toolCalls"]] == [
            ("UNSAFE", "OUTCOME_UNKNOWN"),
            ("READ_ONLY", "COMPLETED"),
        ]
        assert t["toolCalls"][0]["result"] == {
            "error": "files__hang did not answer within 1s (KEYTURN_TOOL_TIMEOUT_S);"
            " whether it acted is unknown",
            "outcomeUnknown": True,
        }
        assert result_event(t, 0)["outcomeUnknown"] is True
        assert shown(t, 0) in t["output"] and shown(t, 1) in t["output"]
        await client.close()


# Two servers on the one store, each offering the keyed slow_write: one can
# be asked about a key, the other's question always fails.
ASKABLE = """
[tools."files__slow_write"]
kind = "IDEMPOTENT"
key_argument = "key"
applied_tool = "files__was_applied"

[tools."other__slow_write"]
kind = "IDEMPOTENT"
key_argument = "key"
applied_tool = "other__fail"
"""


async def test_a_keyed_write_past_the_timeout_is_asked_at_once_and_its_answer_recorded(
    database_url: str, tmp_path: Path, state: Path
) -> None:
    tools_file = write_tools_file(
        tmp_path / "tools.toml",
        stdio_entry(state),
        stdio_entry(state, name="other"),
        overrides=OVERRIDES + ASKABLE,
    )
    calls = [
        # Wrote, then hung: applied.
        call("files__slow_write", {"name": "a", "value": "1", "after": 600}),
        # Hung before writing: asking settles the key, the write never lands.
        call("files__slow_write", {"name": "b", "value": "2", "before": 600}),
        # Hung, and its server cannot say: unknown.
        call("other__slow_write", {"name": "c", "value": "3", "before": 600}),
    ]
    async with serving(database_url, tools_file, tool_timeout_s=3.0) as srv:
        client = GraphQLClient(srv.url)
        t = await run(client, " ".join(calls))
        await client.close()
    late = "did not answer within 3s (KEYTURN_TOOL_TIMEOUT_S)"
    applied, never, unknown = t["toolCalls"]
    assert applied["state"] == "RECONCILED_APPLIED"
    assert applied["result"] == {
        "applied": True,
        "reconciled": True,
        "note": f"files__slow_write {late}; asked afterwards, it says the call was applied",
    }
    assert never["state"] == "RECONCILED_NOT_APPLIED"
    assert never["result"] == {
        "error": f"files__slow_write {late}; asked afterwards, it says the call was not"
        " applied, and now it never will be",
        "applied": False,
    }
    assert unknown["state"] == "OUTCOME_UNKNOWN"
    assert unknown["result"] == {
        "error": f"other__slow_write {late}; whether it acted is unknown",
        "outcomeUnknown": True,
    }
    assert all(shown(t, n) in t["output"] for n in range(3))
    # The store agrees: written once, settled as never, untouched.
    done = effects(state)
    assert [[e["op"] for e in done if e.get("key") == c["effectKey"]] for c in t["toolCalls"]] == [
        ["write"],
        ["settled"],
        [],
    ]


async def first_result(client: GraphQLClient, turn_id: str) -> None:
    """Until the turn's first call has its result recorded."""
    deadline = time.monotonic() + 30
    while True:
        calls = (await turn(client, turn_id))["toolCalls"]
        if calls and calls[0]["result"] is not None:
            return
        assert time.monotonic() < deadline, "the call's result was not recorded"
        await asyncio.sleep(0.05)


async def test_an_unsafe_call_recorded_unknown_still_refuses_a_retry_without_force(
    database_url: str, stdio_tools_file: Path, db: Any
) -> None:
    async with serving(database_url, stdio_tools_file, tool_timeout_s=1.0) as srv:
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        # The reply after the call takes a minute: time to interrupt the turn.
        input = "/sleep 60000 " + call("files__hang", {"seconds": 30})
        tid = (await client.submit(sid, "k", input))["turn"]["id"]
        await first_result(client, tid)
        await take_over(db, tid)
        await client.wait_for_status(tid, {"INTERRUPTED"})
        t = await turn(client, tid)
        assert [(c["kind"], c["state"]) for c in t["toolCalls"]] == [("UNSAFE", "OUTCOME_UNKNOWN")]
        refused = await resolve(client, tid, "RETRY", "again")
        assert refused["__typename"] == "UnsafeRetryRefused"
        assert (refused["index"], refused["tool"]) == (0, "files__hang")
        forced = await resolve(client, tid, "RETRY", "again", force=True)
        assert forced["__typename"] == "TurnResolved"
        await client.close()


async def test_a_keyed_call_left_unknown_in_an_interrupted_turn_is_settled_by_the_next_process(
    database_url: str, tmp_path: Path, state: Path, db: Any
) -> None:
    tools_file = write_tools_file(
        tmp_path / "tools.toml",
        stdio_entry(state, name="flaky"),
        overrides="""
[tools."flaky__slow_write"]
kind = "IDEMPOTENT"
key_argument = "key"
applied_tool = "flaky__flaky_was_applied"
""",
    )
    down = Path(f"{state}.down")
    await asyncio.to_thread(down.touch)  # the tool cannot say whether a key was applied
    input = "/sleep 60000 " + call("flaky__slow_write", {"name": "a", "value": "1", "before": 600})
    async with serving(database_url, tools_file, tool_timeout_s=1.0) as srv:
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        tid = (await client.submit(sid, "k", input))["turn"]["id"]
        await first_result(client, tid)
        # Interrupted, and this process stops while its question still fails.
        await take_over(db, tid)
        await client.wait_for_status(tid, {"INTERRUPTED"})
        t = await turn(client, tid)
        assert [(c["kind"], c["state"]) for c in t["toolCalls"]] == [
            ("IDEMPOTENT", "OUTCOME_UNKNOWN")
        ]
        await client.close()
    await asyncio.to_thread(down.unlink)
    # The next process finds the turn unsettled at its start, and asks.
    async with serving(database_url, tools_file) as srv:
        client = GraphQLClient(srv.url)
        t = await settled(client, tid)
        await client.close()
    [reconciled] = t["toolCalls"]
    assert reconciled["state"] == "RECONCILED_NOT_APPLIED"
    assert [e["op"] for e in effects(state) if e.get("key") == reconciled["effectKey"]] == [
        "settled"
    ]


async def test_a_json_rpc_error_is_the_calls_result_and_the_turn_goes_on(
    client: GraphQLClient,
) -> None:
    t = await run(
        client,
        call("files__reject", {"reason": "no"}) + " " + call("files__echo", {"text": "next"}),
    )
    rejected, echoed = t["toolCalls"]
    assert rejected["state"] == "COMPLETED"
    # The server's JSON-RPC error response (INVALID_PARAMS), not an isError result.
    assert rejected["result"] == {"error": "rejected by the server: no", "code": -32602}
    assert echoed["state"] == "COMPLETED"
    assert shown(t, 0) in t["output"] and shown(t, 1) in t["output"]


async def test_a_stdio_server_that_dies_mid_call_is_started_again_for_the_next_call(
    database_url: str, stdio_tools_file: Path
) -> None:
    async with serving(database_url, stdio_tools_file) as srv:
        client = GraphQLClient(srv.url)

        async def server_pid() -> int:
            t = await run(client, call("files__pid"))
            return int(t["toolCalls"][0]["result"]["structuredContent"]["result"])

        first = await server_pid()
        # A read cut short changed nothing: recorded as an error, the turn goes on.
        read = await run(client, call("files__crash_lookup"))
        assert read["toolCalls"][0]["state"] == "COMPLETED"
        assert "went away during the call" in read["toolCalls"][0]["result"]["error"]
        second = await server_pid()
        assert second != first
        # Anything else cut short may have done its work: recorded as unknown,
        # shown to the model, and the turn goes on (its server started again).
        t = await run(client, call("files__crash") + " " + call("files__pid"))
        assert [(c["kind"], c["state"]) for c in t["toolCalls"]] == [
            ("UNSAFE", "OUTCOME_UNKNOWN"),
            ("READ_ONLY", "COMPLETED"),
        ]
        assert t["toolCalls"][0]["result"] == {
            "error": "files__crash: tool server 'files' went away during the call;"
            " whether it acted is unknown",
            "outcomeUnknown": True,
        }
        assert shown(t, 0) in t["output"]
        third = int(t["toolCalls"][1]["result"]["structuredContent"]["result"])
        assert third not in (first, second)
        await client.close()
