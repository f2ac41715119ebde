"""What the README's "Your own model and tools" promises, end to end: a real
`keyturn serve` against an OpenAI-compatible server and an MCP server over
stdio, a turn that streams its text and calls an MCP tool, watched live over
turnEvents, and a record that says what the tool did."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import GraphQLClient, request, start_server_process, stop_process, ws_session
from tests.support.openai_server import Call, Reply, serve_model
from tests.support.tool_servers import effects, stdio_entry, write_tools_file

pytestmark = pytest.mark.slow

TURN_EVENTS = (
    "subscription($t: ID!, $a: Int) { turnEvents(turnId: $t, afterSeq: $a) { seq type data } }"
)
TOOL_CALLS = """query($id: ID!) { turn(id: $id) { status output
  toolCalls { index tool kind state result } } }"""


async def test_a_turn_streams_and_calls_an_mcp_tool_through_a_model_server(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "mcp-state.jsonl"
    tools_file = write_tools_file(tmp_path / "tools.toml", stdio_entry(state))
    async with serve_model(models=("local-model",)) as model:
        model.script(
            Reply(
                text=("Saving ", "it. "),
                calls=(Call("call_1", "files__put", '{"name": "greeting", "value": "hi"}'),),
            ),
            Reply(text=("Saved: ", "greeting", " is hi."), stall_after_first_s=0.3),
        )
        server = start_server_process(
            database_url,
            tmp_path,
            env={
                "KEYTURN_MODEL": "openai",
                "KEYTURN_OPENAI_BASE_URL": model.base_url,
                "KEYTURN_OPENAI_MODEL": "local-model",
                "KEYTURN_OPENAI_API_KEY": "sk-local-not-a-secret",
                "KEYTURN_TOOLS_FILE": str(tools_file),
            },
            name="own-model",
        )
        client = GraphQLClient(server.url)
        try:
            sid = await client.create_session()
            accepted = await client.submit(sid, "k1", "remember that greeting is hi")
            turn_id = accepted["turn"]["id"]
            seen: list[dict[str, Any]] = []
            async with ws_session(server.ws_url) as ws:

                async def watch() -> None:
                    async for r in ws.subscribe(request(TURN_EVENTS, t=turn_id, a=0)):
                        seen.append(r["turnEvents"])

                await asyncio.wait_for(watch(), 30)  # completes after the terminal event

            turn = (await client.execute(TOOL_CALLS, {"id": turn_id}))["turn"]
            # A replay answers from the record: the model is not asked again.
            asked = model.completions
            replay = await client.submit(sid, "k1", "remember that greeting is hi")
            assert replay["__typename"] == "TurnReplayed"
            assert model.completions == asked == 2
        finally:
            await client.close()
            stop_process(server)

    assert turn["status"] == "COMPLETED", turn
    assert turn["output"] == "Saving it. Saved: greeting is hi."
    types = [e["type"] for e in seen]
    assert types[-1] == "turn.completed"
    assert [e["seq"] for e in seen] == sorted({e["seq"] for e in seen})  # no gap, no dup
    deltas = [e["data"]["text"] for e in seen if e["type"] == "turn.delta"]
    assert "".join(deltas) == turn["output"]
    assert types.index("tool.intent") < types.index("tool.result") < types.index("turn.completed")
    [call] = turn["toolCalls"]
    assert (call["tool"], call["kind"], call["state"]) == ("files__put", "REPEATABLE", "COMPLETED")
    # The MCP server did it, once; the model was sent its result under the call's id.
    assert [e for e in effects(state) if e["op"] == "put"] == [
        {"op": "put", "name": "greeting", "value": "hi"}
    ]
    second = model.requests[1]["messages"]
    tool_message = next(m for m in second if m["role"] == "tool")
    assert tool_message["tool_call_id"] == "call_1"
    assert json.loads(tool_message["content"]) == call["result"]
    assert "sk-local-not-a-secret" not in server.log()
