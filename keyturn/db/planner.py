"""Statistics for PostgreSQL's planner that keep up with a young, fast-growing
table.

A pooled connection keeps each statement's plan: the requests' pool its
generic plan from the first call (keyturn.db.engine.REQUEST_SETTINGS), the
worker's pool PostgreSQL's own choice, which after a few calls is a cached
generic plan too. A kept plan is made again only when a table it reads gets
new statistics. Until a table has any, the planner takes it for ten pages of
rows it knows nothing about; afterwards, for the size its statistics were
taken at. Autovacuum analyzes a table once a tenth of it has changed, but
only on its next round (``autovacuum_naptime``: a minute by default), and
in a minute a young table can grow many times over. Plans made in between
are kept while it grows. Measured on a new database
(tests/integration/test_plan_shapes.py; ``python -m bench.cpu new``, whose
database time per request grew round after round until autovacuum's first
analyze): the admission lookup found its key by reading every turn of its
session along ``ix_turns_session_admit``, and the worker's cancel check read
every turn.

So a process analyzes a table of these itself once it holds ten pages and
twice the rows its statistics counted (or has none): a handful of times in a
table's life, the first within a second of it filling. Rows are counted as
committed (``pg_stat_get_live_tuples``), not as pages: an ANALYZE in the
middle of a long insert counts none of its rows, and the pages it adds show
before they commit.
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
# How much a table may grow past the rows its statistics counted.
GROWTH = 2

_SIZES = Statement(
    """
    SELECT c.relname AS name,
           pg_relation_size(c.oid) / current_setting('block_size')::bigint AS pages,
           pg_stat_get_live_tuples(c.oid) AS live,
           CAST(greatest(c.reltuples, 0) AS bigint) AS counted
    FROM pg_class c
    WHERE c.oid = ANY(CAST(CAST(:tables AS text[]) AS regclass[]))
      -- Those this role may analyze: its own (or a role's it belongs to).
      AND pg_has_role(c.relowner, 'USAGE')
    ORDER BY array_position(CAST(:tables AS text[]), CAST(c.relname AS text))
    """
)


@dataclass(frozen=True, slots=True)
class TableSize:
    """A table's pages and committed rows now, and the rows its statistics
    counted (0: none yet)."""

    name: str
    pages: int
    live: int
    counted: int

    def outgrown(self, tried_at: int = 0) -> bool:
        """Whether its statistics are too small for it: it holds
        ``MIN_PAGES`` pages and ``GROWTH`` times the rows they counted
        (ANALYZE sets both counts, so one analyze puts it right), and
        ``GROWTH`` times the rows it held when an analyze of it was last
        tried (``tried_at``), whatever came of that."""
        return self.pages >= MIN_PAGES and self.live >= GROWTH * max(self.counted, tried_at, 1)


async def sizes(conn: Conn) -> list[TableSize]:
    """The tables of :data:`TABLES` this role may analyze (it owns them)."""
    rows = await _SIZES.fetch(conn, tables=list(TABLES))
    return [TableSize(r["name"], r["pages"], r["live"], r["counted"]) for r in rows]


async def analyze(conn: Conn, names: list[str]) -> None:
    """ANALYZE the named tables of :data:`TABLES` (others are refused, as
    the names go into the statement's text). A table another process is
    analyzing right now is skipped (SKIP_LOCKED): that one does the work."""
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        raise ValueError(f"not a table of the record: {unknown}")
    if names:
        await conn.driver.execute(f"ANALYZE (SKIP_LOCKED) {', '.join(names)}")
