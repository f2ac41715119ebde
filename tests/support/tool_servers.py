"""MCP servers for tests (tests/support/mcp_server.py, over stdio or streamable
HTTP) and the tools files that name them."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from keyturn.ops.serverproc import free_port

SCRIPT = Path(__file__).resolve().parent / "mcp_server.py"
TOKEN = "s3cret-mcp-token"  # a header value: never to be seen in a log or a message

# What the tools file says beyond the annotations: overrides of two kinds,
# and how to key and ask the one IDEMPOTENT tool.
OVERRIDES = """
[tools."files__remove"]
kind = "UNSAFE"

[tools."files__echo"]
kind = "READ_ONLY"

[tools."files__write"]
kind = "IDEMPOTENT"
key_argument = "key"
applied_tool = "files__was_applied"
"""


def stdio_entry(state: Path, name: str = "files") -> str:
    command = json.dumps([sys.executable, str(SCRIPT)])
    return f'[servers.{name}]\ncommand = {command}\nenv = {{ MCP_STATE = "{state}" }}\n'


def http_entry(url: str, name: str = "files") -> str:
    return f'[servers.{name}]\nurl = "{url}"\nheaders = {{ Authorization = "Bearer {TOKEN}" }}\n'


def write_tools_file(path: Path, *entries: str, overrides: str = OVERRIDES) -> Path:
    path.write_text("\n".join(entries) + overrides)
    return path


@contextlib.contextmanager
def http_mcp_server(state: Path, log_dir: Path) -> Iterator[str]:
    """The test server over streamable HTTP in a process of its own; its URL."""
    port = free_port()
    log = (log_dir / f"mcp-http-{port}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--http", str(port), "--token", TOKEN],
        env={"MCP_STATE": str(state), "PATH": "/usr/bin:/bin"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (log_dir / f"mcp-http-{port}.log").read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            assert time.monotonic() < deadline, "the MCP server did not listen in 30s"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def effects(state: Path) -> list[dict[str, Any]]:
    """What the test server did, in order."""
    if not state.exists():
        return []
    return [json.loads(line) for line in state.read_text().splitlines() if line]
