"""Setting tools up, as a user would: ``keyturn serve`` and ``keyturn doctor``
with a tools file of real MCP servers, a tools file with a mistake, a server
that cannot start, and a Python distribution offering a tool by entry point."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import psutil
import pytest

from keyturn.ops.serverproc import free_port
from tests.acceptance.clirun import keyturn, one_clean_line
from tests.integration.test_tool_ledger import turn
from tests.support import GraphQLClient, start_server_process, stop_process
from tests.support.tool_servers import (
    TOKEN,
    http_entry,
    http_mcp_server,
    stdio_entry,
    write_tools_file,
)

pytestmark = pytest.mark.slow

SHOUT = """
from typing import Any

from keyturn.domain import ToolKind


class Shout:
    name = NAME
    kind = ToolKind.READ_ONLY
    description = "TEXT in capitals."
    parameters = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }

    async def run(self, arguments: dict[str, Any], *, effect_key: str) -> dict[str, Any]:
        return {"shouted": arguments["text"].upper()}


def tools() -> list[Shout]:
    return [Shout()]
"""


def shout_distribution(where: Path, name: str = "shout") -> Path:
    """A distribution as an installer leaves it: the module and its
    dist-info with an entry point of the group keyturn.tools."""
    where.mkdir()
    (where / "shout_tools.py").write_text(f"NAME = {name!r}\n{SHOUT}")
    info = where / "shout_tools-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shout-tools\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[keyturn.tools]\nshout = shout_tools:tools\n")
    return where


def test_a_mistake_in_the_tools_file_is_one_line_naming_the_file_and_the_key(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "tools.toml"
    bad.write_text('[servers.files]\ncommand = "python -m files_server"\n')
    port = str(free_port())
    line = one_clean_line(
        keyturn("serve", "--port", port, cwd=tmp_path, KEYTURN_TOOLS_FILE=str(bad))
    )
    assert line == (
        f"keyturn: tools file: KEYTURN_TOOLS_FILE {bad}: servers.files.command: "
        "must be a non-empty list of strings"
    )
    bad.write_text(
        '[tools."files__write"]\nkind = "IDEMPOTENT"\n[servers.files]\nurl = "http://h/mcp"\n'
    )
    line = one_clean_line(
        keyturn("serve", "--port", port, cwd=tmp_path, KEYTURN_TOOLS_FILE=str(bad))
    )
    assert 'tools."files__write".key_argument: an IDEMPOTENT tool needs' in line
    # Whether the server offers the tool is known once it has started.
    stdio = stdio_entry(tmp_path / "effects.jsonl")
    write_tools_file(bad, stdio, overrides='[tools."files__nope"]\nkind = "UNSAFE"\n')
    line = one_clean_line(
        keyturn("serve", "--port", port, cwd=tmp_path, KEYTURN_TOOLS_FILE=str(bad))
    )
    assert line == (
        f"keyturn: tool server files: KEYTURN_TOOLS_FILE {bad}: "
        """tools."files__nope": server 'files' offers no tool 'nope'"""
    )


def test_a_server_that_cannot_start_stops_serve_and_doctor_says_which(
    tmp_path: Path, database_url: str
) -> None:
    state = tmp_path / "effects.jsonl"
    tools = write_tools_file(
        tmp_path / "tools.toml",
        stdio_entry(state),
        '[servers.broken]\ncommand = ["/nonexistent/mcp-server"]\n',
    )
    port = str(free_port())
    serve = keyturn(
        "serve",
        "--port",
        port,
        cwd=tmp_path,
        KEYTURN_TOOLS_FILE=str(tools),
        KEYTURN_DATABASE_URL=database_url,
    )
    line = one_clean_line(serve)
    assert line.startswith(
        "keyturn: tool server broken: tool server 'broken' (stdio /nonexistent/mcp-server) "
        "did not start: FileNotFoundError"
    )
    doctor = keyturn(
        "doctor", cwd=tmp_path, KEYTURN_TOOLS_FILE=str(tools), KEYTURN_DATABASE_URL=database_url
    )
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    lines = doctor.stdout.splitlines()
    assert any(
        line.startswith("fail  tool server broken: tool server 'broken'") for line in lines
    ), doctor.stdout
    assert any(line.startswith("ok    tool server files: started (stdio ") for line in lines), (
        doctor.stdout
    )


def test_doctor_lists_each_server_and_its_tools_with_their_kinds_and_no_secret(
    tmp_path: Path, database_url: str
) -> None:
    state = tmp_path / "effects.jsonl"
    dist = shout_distribution(tmp_path / "dist")
    with http_mcp_server(state, tmp_path) as url:
        tools = write_tools_file(
            tmp_path / "tools.toml", stdio_entry(state), http_entry(url, name="search")
        )
        doctor = keyturn(
            "doctor",
            cwd=tmp_path,
            KEYTURN_TOOLS_FILE=str(tools),
            KEYTURN_DATABASE_URL=database_url,
            PYTHONPATH=str(dist),
        )
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    lines = {line.split(":")[0]: line for line in doctor.stdout.splitlines()}
    assert lines["ok    tools python"] == "ok    tools python:shout: shout READ_ONLY"
    assert lines["ok    tools file"] == f"ok    tools file: {tools}: 2 server(s)"
    files = lines["ok    tool server files"]
    assert "files__lookup READ_ONLY" in files and "files__write IDEMPOTENT" in files
    search = lines["ok    tool server search"]
    assert search.startswith(f"ok    tool server search: started (streamable HTTP {url})")
    assert "search__put REPEATABLE" in search and "search__append UNSAFE" in search
    # A tool listed under a name no model API takes is said, not offered.
    assert "files__file.stat" not in files
    assert "warn  tool server files: tool 'file.stat' is not offered" in doctor.stdout
    assert TOKEN not in doctor.stdout + doctor.stderr


async def test_a_python_tool_from_an_entry_point_is_offered_and_runs(
    tmp_path: Path, database_url: str
) -> None:
    dist = shout_distribution(tmp_path / "dist")
    server = start_server_process(database_url, tmp_path, env={"PYTHONPATH": str(dist)})
    try:
        client = GraphQLClient(server.url)
        listed = (await client.execute("{ tools { name kind source description } }"))["tools"]
        assert {
            "name": "shout",
            "kind": "READ_ONLY",
            "source": "python:shout",
            "description": "TEXT in capitals.",
        } in listed
        sid = await client.create_session()
        text = json.dumps({"text": "hello"})
        tid = (await client.submit(sid, "k", f"/call shout {text}"))["turn"]["id"]
        await client.wait_for_status(tid, {"COMPLETED"})
        [shouted] = (await turn(client, tid))["toolCalls"]
        assert (shouted["kind"], shouted["state"]) == ("READ_ONLY", "COMPLETED")
        assert shouted["result"] == {"shouted": "HELLO"}
        await client.close()
    finally:
        stop_process(server)


def test_a_python_tool_with_a_name_already_offered_stops_serve(tmp_path: Path) -> None:
    dist = shout_distribution(tmp_path / "dist", name="synthetic_read")
    serve = keyturn("serve", "--port", str(free_port()), cwd=tmp_path, PYTHONPATH=str(dist))
    assert one_clean_line(serve) == (
        "keyturn: tools: tool 'synthetic_read' is offered twice: by builtin and by python:shout"
    )


async def test_a_stdio_server_lives_as_long_as_the_keyturn_process(
    tmp_path: Path, database_url: str
) -> None:
    tools = write_tools_file(tmp_path / "tools.toml", stdio_entry(tmp_path / "effects.jsonl"))
    server = start_server_process(database_url, tmp_path, env={"KEYTURN_TOOLS_FILE": str(tools)})
    try:
        client = GraphQLClient(server.url)
        pids = []
        for key in ("a", "b"):
            sid = await client.create_session()
            tid = (await client.submit(sid, key, "/call files__pid"))["turn"]["id"]
            await client.wait_for_status(tid, {"COMPLETED"})
            [called] = (await turn(client, tid))["toolCalls"]
            pids.append(called["result"]["structuredContent"]["result"])
        await client.close()
    finally:
        stop_process(server)
    # One server for both turns, stopped with the process that started it.
    assert pids[0] == pids[1]
    deadline = time.monotonic() + 10
    while alive(pids[0]):
        assert time.monotonic() < deadline, "the MCP server outlived Keyturn"
        await asyncio.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
