"""The first statistics of a new database's tables, for PostgreSQL's planner.

A pooled connection keeps each statement's plan: the requests' pool its
generic plan from the first call (keyturn.db.engine.REQUEST_SETTINGS), the
worker's pool PostgreSQL's own choice, which after a few calls is a cached
generic plan too. A cached plan is made again only when a table it reads
gets new statistics (ANALYZE). Until a table has statistics the planner
takes it for ten pages of rows it knows nothing about, and on a new database
autovacuum analyzes a table only on its first round after the table changed
(``autovacuum_naptime``: a minute by default). Plans made in between are kept
while the table grows. Measured on a new database (tests/integration/
test_plan_shapes.py, and ``python -m bench.cpu new``, whose database time
per request grew round after round until autovacuum's first analyze): the
admission lookup found its key by reading every turn of the session along
``ix_turns_session_admit``, and the worker's cancel check read every turn.

So a process analyzes these tables itself, once each, when one has grown
past ``MIN_PAGES`` with statistics made from fewer (or none); then autovacuum
keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass

from keyturn.db.engine import Conn
from keyturn.db.sql import Statement

# The tables every hot statement reads, in the order they are analyzed.
TABLES = ("sessions", "turns", "events", "session_keys")
# Below ten pages the planner assumes ten pages anyway (PostgreSQL's
# estimate_rel_size), so statistics from a smaller table tell it nothing.
MIN_PAGES = 10

_SMALL = Statement(
    """
    SELECT c.relname AS name,
           pg_relation_size(c.oid)
               >= CAST(:min_pages AS bigint) * current_setting('block_size')::bigint AS grown
    FROM pg_class c
    WHERE c.oid = ANY(CAST(CAST(:tables AS text[]) AS regclass[]))
      AND c.relpages < :min_pages
    ORDER BY array_position(CAST(:tables AS text[]), CAST(c.relname AS text))
    """
)


@dataclass(frozen=True, slots=True)
class SmallTable:
    """A table whose statistics come from fewer than ``MIN_PAGES`` pages
    (or that was never analyzed), and whether it now holds that many."""

    name: str
    grown: bool


async def small_tables(conn: Conn) -> list[SmallTable]:
    rows = await _SMALL.fetch(conn, tables=list(TABLES), min_pages=MIN_PAGES)
    return [SmallTable(r["name"], r["grown"]) for r in rows]


async def analyze(conn: Conn, names: list[str]) -> None:
    """ANALYZE the named tables of :data:`TABLES` (others are refused, as
    the names go into the statement's text). A table another process is
    analyzing right now is skipped (SKIP_LOCKED): that one does the work."""
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        raise ValueError(f"not a table of the record: {unknown}")
    if names:
        await conn.driver.execute(f"ANALYZE (SKIP_LOCKED) {', '.join(names)}")
