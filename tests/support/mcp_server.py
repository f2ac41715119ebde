"""A real MCP server for the tests, built with the ``mcp`` SDK's FastMCP.

Run as a script (it imports nothing of Keyturn or of the tests):

    python tests/support/mcp_server.py                 # stdio
    python tests/support/mcp_server.py --http PORT --token TOKEN

``MCP_STATE`` names a file of JSON lines, one per effect, that outlives the
server (a Keyturn process killed in a test takes its stdio server with it;
the next one's server reads the same file). Each tool's annotations say what
the tests expect its kind to be.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import anyio
from mcp import types
from mcp.server.fastmcp import FastMCP
from mcp.shared.exceptions import McpError
from mcp.types import ToolAnnotations

server = FastMCP("keyturn-tests", log_level="WARNING")
READ_ONLY = ToolAnnotations(readOnlyHint=True)
REPEATABLE = ToolAnnotations(readOnlyHint=False, idempotentHint=True, destructiveHint=True)


def _state() -> Path:
    return Path(os.environ["MCP_STATE"])


def _effects() -> list[dict[str, Any]]:
    path = _state()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _record(effect: dict[str, Any]) -> None:
    # One short append per effect: whole lines, even from two processes.
    with _state().open("a") as out:
        out.write(json.dumps(effect) + "\n")


def _value(name: str) -> str | None:
    values = [e["value"] for e in _effects() if e.get("name") == name and "value" in e]
    return values[-1] if values else None


@server.tool(annotations=READ_ONLY, description="The latest value under NAME.")
def lookup(name: str) -> dict[str, Any]:
    return {"name": name, "value": _value(name)}


@server.tool(annotations=REPEATABLE, description="Set NAME to VALUE (repeating adds nothing).")
def put(name: str, value: str) -> dict[str, Any]:
    _record({"op": "put", "name": name, "value": value})
    return {"name": name, "value": value}


@server.tool(annotations=REPEATABLE, description="Forget NAME.")
def remove(name: str) -> dict[str, Any]:
    _record({"op": "remove", "name": name})
    return {"removed": name}


@server.tool(description="Append VALUE under NAME; every call appends again.")
def append(name: str, value: str) -> dict[str, Any]:
    _record({"op": "append", "name": name, "value": value})
    return {"appended": value}


@server.tool(description="Repeat TEXT back.")
def echo(text: str) -> str:
    return text


@server.tool(description="Set NAME to VALUE at most once per KEY.")
def write(key: str, name: str, value: str) -> dict[str, Any]:
    effects = [e for e in _effects() if e.get("key") == key]
    if any(e["op"] == "settled" for e in effects):
        raise ValueError(f"key {key} was settled as not applied")
    if any(e["op"] == "write" for e in effects):
        return {"applied": True, "alreadyApplied": True}
    _record({"op": "write", "key": key, "name": name, "value": value})
    return {"applied": True, "alreadyApplied": False}


@server.tool(description="Sleeps BEFORE seconds, writes as `write` does, then sleeps AFTER.")
async def slow_write(
    key: str, name: str, value: str, before: float = 0, after: float = 0
) -> dict[str, Any]:
    await anyio.sleep(before)
    written: dict[str, Any] = write(key, name, value)
    await anyio.sleep(after)
    return written


@server.tool(
    annotations=READ_ONLY,
    description="Was KEY applied? A key found not applied is settled: it never applies later.",
)
def was_applied(key: str) -> dict[str, Any]:
    effects = [e for e in _effects() if e.get("key") == key]
    if any(e["op"] == "write" for e in effects):
        return {"applied": True}
    if not effects:
        _record({"op": "settled", "key": key})
    return {"applied": False}


@server.tool(
    annotations=READ_ONLY,
    description="Answers as was_applied does, but fails while the file MCP_STATE.down exists.",
)
def flaky_was_applied(key: str) -> dict[str, Any]:
    if Path(f"{_state()}.down").exists():
        raise RuntimeError("the store is down")
    answer: dict[str, Any] = was_applied(key)
    return answer


@server.tool(description="Always fails.")
def fail(reason: str) -> str:
    raise ValueError(f"refused: {reason}")


@server.tool(description="Sleeps SECONDS, then answers.")
async def hang(seconds: float) -> str:
    await anyio.sleep(seconds)
    return "woke"


@server.tool(annotations=READ_ONLY, description="Sleeps SECONDS, then answers.")
async def slow_lookup(seconds: float) -> str:
    await anyio.sleep(seconds)
    return "woke"


@server.tool(description="The server process exits during the call.")
def crash() -> str:
    os._exit(3)


@server.tool(annotations=READ_ONLY, description="The server process exits during the call.")
def crash_lookup() -> str:
    os._exit(3)


@server.tool(description="Answers a JSON-RPC error, not a result (see _protocol_errors).")
def reject(reason: str) -> str:
    return "never reached"


def _protocol_errors() -> None:
    """Make ``reject`` answer a JSON-RPC error. FastMCP turns whatever a tool
    raises, McpError included, into an ``isError`` result; an McpError raised
    by the request handler itself is sent as the JSON-RPC error response."""
    handlers = server._mcp_server.request_handlers
    call_tool = handlers[types.CallToolRequest]

    async def handler(request: types.CallToolRequest) -> types.ServerResult:
        if request.params.name == "reject":
            reason = (request.params.arguments or {}).get("reason", "")
            raise McpError(
                types.ErrorData(
                    code=types.INVALID_PARAMS, message=f"rejected by the server: {reason}"
                )
            )
        return await call_tool(request)

    handlers[types.CallToolRequest] = handler


_protocol_errors()


@server.tool(annotations=READ_ONLY, description="This server process's id.")
def pid() -> int:
    return os.getpid()


@server.tool(name="file.stat", annotations=READ_ONLY, description="A name no model API takes.")
def stat() -> str:
    return "never offered"


def _serve_http(port: int, token: str) -> None:
    import uvicorn
    from starlette.types import Receive, Scope, Send

    app = server.streamable_http_app()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no"})
                return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on PORT")
    parser.add_argument("--token", default="", help="the bearer token HTTP requests need")
    options = parser.parse_args()
    if options.http is None:
        server.run("stdio")
    else:
        _serve_http(options.http, options.token)
