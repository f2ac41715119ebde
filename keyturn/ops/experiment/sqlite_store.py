"""The store of the experiment's MCP server (:mod:`keyturn.ops.experiment.mcp_store`):
a SQLite file that is not the record, and the tools file that names the server.

The file outlives the server: a Keyturn process killed in the experiment
takes its stdio server with it, and the replacement's server opens the same
file. Two such servers may overlap for a moment, so every change is one
``BEGIN IMMEDIATE`` transaction. The experiment reads the file directly.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from enum import Enum
from pathlib import Path

SERVER = "store"  # the server's name in the tools file: tools are store__TOOL
KEY_ARGUMENT = "key"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS vals (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS keyed (
    key TEXT PRIMARY KEY, applied INTEGER NOT NULL, name TEXT, value TEXT
);
CREATE TABLE IF NOT EXISTS appended (
    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, value TEXT NOT NULL
);
"""


class Write(Enum):
    APPLIED = "applied"
    ALREADY_APPLIED = "already_applied"  # this key was applied before
    SETTLED_NOT_APPLIED = "settled_not_applied"  # asking settled this key as never applied


class Store:
    """The SQLite file: values (``read``/``set``), keyed writes, appends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connection() as conn:
            conn.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._connection() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    # -- what the tools do -----------------------------------------------------
    def read(self, name: str) -> str | None:
        with self._connection() as conn:
            row = conn.execute("SELECT value FROM vals WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def set(self, name: str, value: str) -> None:
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO vals (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (name, value),
            )

    def write(self, key: str, name: str, value: str) -> Write:
        with self._transaction() as conn:
            row = conn.execute("SELECT applied FROM keyed WHERE key = ?", (key,)).fetchone()
            if row is not None:
                return Write.ALREADY_APPLIED if row[0] else Write.SETTLED_NOT_APPLIED
            conn.execute(
                "INSERT INTO keyed (key, applied, name, value) VALUES (?, 1, ?, ?)",
                (key, name, value),
            )
        return Write.APPLIED

    def settle(self, key: str) -> bool:
        """Was ``key`` applied? A key not applied is settled as never
        applied, so the answer is final: a write with it arriving later does
        nothing."""
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO keyed (key, applied) VALUES (?, 0) ON CONFLICT (key) DO NOTHING",
                (key,),
            )
            row = conn.execute("SELECT applied FROM keyed WHERE key = ?", (key,)).fetchone()
        return bool(row[0])

    def append(self, name: str, value: str) -> int:
        with self._transaction() as conn:
            cursor = conn.execute("INSERT INTO appended (name, value) VALUES (?, ?)", (name, value))
        return int(cursor.lastrowid or 0)

    # -- what the experiment reads ---------------------------------------------
    def values(self, names: Sequence[str]) -> dict[str, str | None]:
        return {name: self.read(name) for name in names}

    def applied_counts(self, keys: Sequence[str]) -> dict[str, int]:
        """How many times each key was applied (0 or 1; settled keys: 0)."""
        with self._connection() as conn:
            rows = conn.execute("SELECT key, applied FROM keyed").fetchall()
        found = {str(k): int(applied) for k, applied in rows}
        return {key: found.get(key, 0) for key in keys}

    def answered(self, keys: Sequence[str]) -> frozenset[str]:
        """The keys the store has an answer for: applied, or settled by a question."""
        with self._connection() as conn:
            rows = conn.execute("SELECT key FROM keyed").fetchall()
        return frozenset(str(k) for (k,) in rows) & frozenset(keys)

    def append_counts(self, names: Sequence[str]) -> dict[str, int]:
        with self._connection() as conn:
            rows = conn.execute("SELECT name, count(*) FROM appended GROUP BY name").fetchall()
        found = {str(name): int(n) for name, n in rows}
        return {name: found.get(name, 0) for name in names}


def tools_file(path: Path, store: Path) -> Path:
    """Write a tools file (``KEYTURN_TOOLS_FILE``) that names this server on
    ``store``, with the overrides that make ``write`` IDEMPOTENT."""
    command = [sys.executable, "-m", "keyturn.ops.experiment.mcp_store", "--store", str(store)]
    # A JSON array of strings is a TOML array of basic strings.
    path.write_text(
        f"[servers.{SERVER}]\n"
        f"command = {json.dumps(command)}\n\n"
        f'[tools."{SERVER}__write"]\n'
        'kind = "IDEMPOTENT"\n'
        f'key_argument = "{KEY_ARGUMENT}"\n'
        f'applied_tool = "{SERVER}__applied"\n',
        encoding="utf-8",
    )
    return path
