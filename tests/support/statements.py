"""Counting the statements a server in this test's process runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from keyturn.db import planner, sql


@contextlib.contextmanager
def counting_statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement the server runs (it shares this test's process),
    but for the statistics check every process makes once a second
    (keyturn.runtime.planner), which no request sends and which lands
    inside a counted request now and then."""
    seen: list[str] = []
    background = planner._SIZES.text
    for name in ("fetch", "fetchrow", "fetchval", "execute"):
        original = getattr(sql.Statement, name)

        def counted(self: sql.Statement, conn: Any, _original: Any = original, **p: Any) -> Any:
            if self.text != background:
                seen.append(self.text)
            return _original(self, conn, **p)

        monkeypatch.setattr(sql.Statement, name, counted)
    try:
        yield seen
    finally:
        monkeypatch.undo()
