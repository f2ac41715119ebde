"""Tools from real MCP servers (tests/support/mcp_server.py, FastMCP) over stdio
and streamable HTTP, called through Keyturn's API with the fixture's ``/call``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_tool_ledger import turn
from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process
from tests.support.tool_servers import (
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


async def test_past_the_timeout_a_read_is_an_error_and_a_write_is_unknown(
    database_url: str, stdio_tools_file: Path
) -> None:
    async with serving(database_url, stdio_tools_file, tool_timeout_s=1.0) as srv:
        client = GraphQLClient(srv.url)
        read = await run(client, call("files__slow_lookup", {"seconds": 30}))
        assert read["toolCalls"][0]["state"] == "COMPLETED"
        assert "did not answer within 1s" in read["toolCalls"][0]["result"]["error"]
        # A write that did not answer may still be at work: its effect is unknown.
        write = await run(client, call("files__hang", {"seconds": 30}), status="INTERRUPTED")
        assert [(c["kind"], c["state"]) for c in write["toolCalls"]] == [
            ("UNSAFE", "OUTCOME_UNKNOWN")
        ]
        await client.close()


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
        assert "went away during the call" in read["toolCalls"][0]["result"]["error"]
        second = await server_pid()
        assert second != first
        # Anything else cut short may have done its work: OUTCOME_UNKNOWN.
        unsafe = await run(client, call("files__crash"), status="INTERRUPTED")
        assert [(c["kind"], c["state"]) for c in unsafe["toolCalls"]] == [
            ("UNSAFE", "OUTCOME_UNKNOWN")
        ]
        assert await server_pid() not in (first, second)
        await client.close()
