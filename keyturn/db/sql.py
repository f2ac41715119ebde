"""How Keyturn runs SQL: one way, for every statement of the runtime.

A :class:`Statement` is SQL text with ``:name`` parameters, run on the asyncpg
connection beneath the pool, which prepares it once per connection and caches
it. SQLAlchemy's per-execution work cost as much as the database's for the
short statements Keyturn runs (measured: +50% admissions/s without it), so it
keeps only the pool and the migrations.

SELECT lists are generated from the SQLModel tables (:func:`columns`), and
the step every writer shares, "bump the session's counter, append an event",
is written once (:func:`append_event`).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sqlmodel import SQLModel

if TYPE_CHECKING:
    from keyturn.db.engine import Conn
    from keyturn.db.records import Row

# A ``:name`` parameter, or a quoted literal or a ``--`` comment (left alone:
# ``'a:b'`` is text, and an apostrophe in a comment opens no literal).
# ``::type`` casts are not parameters.
_PARAM = re.compile(r"'(?:[^']|'')*'|--[^\n]*|(?<![:\w]):([A-Za-z_]\w*)")


class Statement:
    def __init__(self, sql: str) -> None:
        self.text = sql
        order: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) is None:
                return match.group(0)  # a literal
            if match.group(1) not in order:
                order.append(match.group(1))
            return f"${order.index(match.group(1)) + 1}"

        self.sql = _PARAM.sub(number, sql)
        self.names = tuple(order)

    def __str__(self) -> str:
        return self.text

    def _args(self, params: dict[str, Any]) -> list[Any]:
        return [params[name] for name in self.names]

    async def fetch(self, conn: Conn, **params: Any) -> list[Row]:
        rows: list[Row] = await conn.driver.fetch(self.sql, *self._args(params))
        return rows

    async def fetchrow(self, conn: Conn, **params: Any) -> Row | None:
        row: Row | None = await conn.driver.fetchrow(self.sql, *self._args(params))
        return row

    async def fetchval(self, conn: Conn, **params: Any) -> Any:
        return await conn.driver.fetchval(self.sql, *self._args(params))

    async def execute(self, conn: Conn, **params: Any) -> None:
        await conn.driver.execute(self.sql, *self._args(params))

    async def executemany(self, conn: Conn, rows: Iterable[dict[str, Any]]) -> None:
        """One statement for many parameter sets (a batch of an import)."""
        await conn.driver.executemany(self.sql, [self._args(params) for params in rows])

    def cursor(self, conn: Conn, *, prefetch: int = 500, **params: Any) -> AsyncIterator[Row]:
        """The rows one at a time from a server-side cursor, ``prefetch`` per
        round trip, so that a large result is never held whole. Only inside
        a transaction (PostgreSQL closes a cursor at its end)."""
        rows: AsyncIterator[Row] = conn.driver.cursor(
            self.sql, *self._args(params), prefetch=prefetch
        )
        return rows


def columns(table: type[SQLModel], *, alias: str | None = None, prefix: str = "") -> str:
    """The table's columns for a SELECT or RETURNING list, in table order:
    ``t.id AS t_id, …`` with an alias and a prefix, ``id, …`` without."""
    names = [c.name for c in table.__table__.columns]  # type: ignore[attr-defined]
    qualified = [f"{alias}.{n}" if alias else n for n in names]
    if prefix:
        return ", ".join(f"{q} AS {prefix}{n}" for q, n in zip(qualified, names, strict=True))
    return ", ".join(qualified)


def append_event(
    source: str, *, type: str, data: str, next_seq: str = "sessions.event_seq + 1"
) -> str:
    """Two CTEs, ``bump`` and ``ev``, that append one event per row of the CTE
    ``source`` (which has ``id``, the turn, and ``session_id``; at most one
    row per session): the session's counter is bumped and the event takes the
    new value as its seq. The session row is locked by the bump, so seq stays
    gapless and commit-ordered; a ``source`` with no rows appends nothing.

    ``type`` and ``data`` are SQL expressions over ``source`` and parameters.
    """
    return f"""bump AS (
        UPDATE sessions SET event_seq = {next_seq}
        FROM {source} WHERE sessions.id = {source}.session_id
        RETURNING sessions.id, sessions.event_seq
    ), ev AS (
        INSERT INTO events (session_id, turn_id, seq, type, data)
        SELECT {source}.session_id, {source}.id, bump.event_seq, {type}, {data}
        FROM {source} JOIN bump ON bump.id = {source}.session_id
        RETURNING seq
    )"""


def literal(value: StrEnum) -> str:
    """A vocabulary value written into SQL (``'RUNNING'``): these are constants
    of :mod:`keyturn.domain`, never input, and a literal lets the planner use
    the partial indexes whose predicates name them."""
    return f"'{value.value}'"


def literals(values: Iterable[StrEnum]) -> str:
    """``'A', 'B'`` for an ``IN (…)``: in the order given (an enum's is its
    definition order), sets sorted so that the text is stable."""
    ordered = sorted(values, key=lambda v: v.value) if isinstance(values, frozenset) else values
    return ", ".join(literal(v) for v in ordered)
