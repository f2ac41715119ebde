"""The interruption experiment's MCP server, started as Keyturn starts it
(over stdio, from the tools file the experiment writes): the kinds Keyturn
gives its tools, and what the keyed write and its question do."""

from __future__ import annotations

from pathlib import Path

from keyturn.domain import ToolKind
from keyturn.ops.experiment.sqlite_store import Store, tools_file
from keyturn.runtime.mcp_tools import McpServers, annotated_kind
from keyturn.runtime.tools_file import load


async def test_the_experiment_server_offers_one_tool_of_each_kind(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.sqlite3")
    servers = McpServers(load(tools_file(tmp_path / "tools.toml", store.path)), ready_wait_s=5)
    [(source, offered)] = await servers.start()
    try:
        assert source == "mcp:store"
        tools = {t.name: t for t in offered}
        assert {name: t.kind for name, t in tools.items()} == {
            "store__read": ToolKind.READ_ONLY,
            "store__set": ToolKind.REPEATABLE,
            "store__write": ToolKind.IDEMPOTENT,  # the file's override
            "store__applied": ToolKind.REPEATABLE,
            "store__append": ToolKind.UNSAFE,
        }
        # What the server itself claims, read as Keyturn reads annotations.
        listed = {t.name: annotated_kind(t) for t in servers.servers[0].listed}
        assert listed["write"] is ToolKind.REPEATABLE

        write = tools["store__write"]
        assert await write.run({"name": "a", "value": "1"}, effect_key="t/0") == {
            "structuredContent": {"applied": True, "alreadyApplied": False}
        }
        assert await write.run({"name": "a", "value": "1"}, effect_key="t/0") == {
            "structuredContent": {"applied": True, "alreadyApplied": True}
        }
        assert await write.applied("t/0") is True
        assert await write.applied("t/1") is False  # settled: never applied
        refused = await write.run({"name": "b", "value": "1"}, effect_key="t/1")
        assert "settled as never applied" in refused["error"]

        await tools["store__set"].run({"name": "s", "value": "1"}, effect_key="t/2")
        assert await tools["store__read"].run({"name": "s"}, effect_key="t/3") == {
            "structuredContent": {"name": "s", "value": "1"}
        }
        for _ in range(2):
            await tools["store__append"].run({"name": "c", "value": "1"}, effect_key="t/4")
    finally:
        await servers.stop()
    # The store the experiment reads is the one the server wrote.
    assert store.applied_counts(["t/0", "t/1"]) == {"t/0": 1, "t/1": 0}
    assert store.values(["s"]) == {"s": "1"}
    assert store.append_counts(["c"]) == {"c": 2}
