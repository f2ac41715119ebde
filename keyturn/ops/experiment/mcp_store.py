"""The interruption experiment's MCP server: one tool of each kind, over
stdio, writing a store that is not the record (a SQLite file).

    python -m keyturn.ops.experiment.mcp_store --store PATH

Built with the ``mcp`` SDK's FastMCP. Each tool's annotations say honestly
what it does; the tools file the experiment writes
(:func:`keyturn.ops.experiment.sqlite_store.tools_file`) adds what annotations
cannot say, how ``write`` is keyed and asked about:

===========  ===================================  ==============================
tool         annotations                          Keyturn's kind
===========  ===================================  ==============================
``read``     readOnlyHint                         READ_ONLY
``set``      idempotentHint (setting NAME to      REPEATABLE
             VALUE again changes nothing)
``write``    idempotentHint (per key); the file   IDEMPOTENT
             names ``key`` and ``applied``
``applied``  idempotentHint (it settles a key)    REPEATABLE (Keyturn asks it)
``append``   none: every call appends again       UNSAFE
===========  ===================================  ==============================

Its store, a SQLite file, is :mod:`keyturn.ops.experiment.sqlite_store`
(imported by the experiment, which does not import this module: it runs it).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

from keyturn.ops.experiment.sqlite_store import Store, Write


def build_server(store: Store) -> FastMCP:
    server = FastMCP("keyturn-experiment-store", log_level="WARNING")

    @server.tool(
        name="read",
        annotations=ToolAnnotations(readOnlyHint=True),
        description="The value under NAME (null when there is none).",
    )
    def read(name: str) -> dict[str, Any]:
        return {"name": name, "value": store.read(name)}

    @server.tool(
        name="set",
        annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True, destructiveHint=True),
        description="Set NAME to VALUE; setting it to VALUE again changes nothing.",
    )
    def set_value(name: str, value: str) -> dict[str, Any]:
        store.set(name, value)
        return {"name": name, "value": value}

    @server.tool(
        name="write",
        annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True, destructiveHint=False),
        description="Write VALUE under NAME, at most once per KEY.",
    )
    def write(key: str, name: str, value: str) -> dict[str, Any]:
        done = store.write(key, name, value)
        if done is Write.SETTLED_NOT_APPLIED:
            raise ValueError(f"key {key} was settled as never applied")
        return {"applied": True, "alreadyApplied": done is Write.ALREADY_APPLIED}

    @server.tool(
        name="applied",
        annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True, destructiveHint=False),
        description="Was KEY written? A key not written is settled: it is never written later.",
    )
    def applied(key: str) -> dict[str, Any]:
        return {"applied": store.settle(key)}

    @server.tool(
        name="append",
        annotations=ToolAnnotations(
            readOnlyHint=False, idempotentHint=False, destructiveHint=False
        ),
        description="Append VALUE under NAME; every call appends again.",
    )
    def append(name: str, value: str) -> dict[str, Any]:
        return {"appended": store.append(name, value)}

    return server


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m keyturn.ops.experiment.mcp_store",
        description="The interruption experiment's MCP server, over stdio.",
    )
    parser.add_argument("--store", type=Path, required=True, help="the SQLite file")
    options = parser.parse_args(argv)
    build_server(Store(options.store)).run("stdio")


if __name__ == "__main__":
    main()
