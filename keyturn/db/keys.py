"""A session's one namespace of keys: ``session_keys``.

A key names one submitted turn, one resolution, one cancel or one decision
on a tool call in its session, never two of them. Every write that takes a
key inserts the key's row in the same statement or transaction as the rest
of its write, and the table's primary key decides between them: a unique
index is judged against what is committed (an insert waits for a concurrent
one to commit or roll back), where a ``NOT EXISTS`` in a statement reads the
record as it stood when the statement began, before it waited for the
session's lock.

Every key-taking write also holds the session row (FOR UPDATE) when its key
row goes in, so a read of a key made after taking that lock (as a cancel
does) is current, and a write that read it earlier (a resolution, a
decision) meets the primary key instead: its statement fails whole and it
reads what holds the key.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from keyturn.db.engine import Conn
from keyturn.db.records import Row
from keyturn.db.sql import Statement, literal, literals
from keyturn.domain import EventType, KeyKind

PRIMARY_KEY = "pk_session_keys"
TURN = literal(KeyKind.TURN)


def holder(session: str) -> str:
    """Select-list columns ``key_kind`` and ``key_turn_id``: what holds
    ``:key`` in the session ``session`` (an SQL expression), and the turn it
    concerns; both NULL when the key is free."""
    return f"""
    (SELECT k.kind FROM session_keys k
     WHERE k.session_id = {session} AND k.idempotency_key = :key) AS key_kind,
    (SELECT k.turn_id FROM session_keys k
     WHERE k.session_id = {session} AND k.idempotency_key = :key) AS key_turn_id"""


def take(source: str, kind: KeyKind, *, session: str, turn: str, where: str = "true") -> str:
    """A CTE ``taken`` that inserts the key ``:key``'s row for each row of
    ``source`` (``session`` and ``turn`` are expressions over it) that meets
    ``where``. A key already held makes the statement fail with a unique
    violation of ``PRIMARY_KEY``, which undoes the whole write; the caller
    then reads what holds the key, as after any lost race."""
    return f"""taken AS (
        INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
        SELECT {session}, :key, {literal(kind)}, {turn} FROM {source} WHERE {where}
        RETURNING 1
    )"""


@dataclass(frozen=True, slots=True)
class Holder:
    """What holds a key in a session, if anything."""

    kind: KeyKind | None
    turn_id: uuid.UUID | None

    @staticmethod
    def of(row: Row) -> Holder:
        kind = row["key_kind"]
        return Holder(KeyKind(kind) if kind is not None else None, row["key_turn_id"])

    def turn_if(self, *kinds: KeyKind) -> uuid.UUID | None:
        """The turn the key concerns, if one of ``kinds`` holds it."""
        return self.turn_id if self.kind in kinds else None


# The keys a session's record implies, each with its rank: where two rows
# name one key, the lower rank holds it, as migration 0012 filled the table
# (a resolution's key before its RETRY's turn, which was admitted under it).
_DERIVED = f"""
    SELECT 1 AS rank, idempotency_key, {literal(KeyKind.RESOLUTION)} AS kind, turn_id
    FROM resolutions WHERE session_id = :session_id
    UNION ALL
    SELECT 2, idempotency_key, {TURN}, id FROM turns WHERE session_id = :session_id
    UNION ALL
    SELECT 3, idempotency_key, {TURN}, turn_id FROM key_tombstones WHERE session_id = :session_id
    UNION ALL
    SELECT 4, cancel_key, {literal(KeyKind.CANCEL)}, id FROM turns
    WHERE session_id = :session_id AND cancel_key IS NOT NULL
    UNION ALL
    SELECT 5, data ->> 'idempotencyKey', {literal(KeyKind.DECISION)}, turn_id
    FROM events
    WHERE session_id = :session_id
      AND type IN ({literals((EventType.TOOL_APPROVED, EventType.TOOL_REJECTED))})
      AND turn_id IS NOT NULL AND data ->> 'idempotencyKey' IS NOT NULL
"""

_REBUILD = Statement(
    f"""
    INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
    SELECT :session_id, idempotency_key, kind, turn_id FROM ({_DERIVED}) d
    ORDER BY rank
    ON CONFLICT DO NOTHING
    """
)

# How a session's keys differ from what its record implies: a key the
# record implies that is not held as it implies, and a key held that the
# record does not imply. Only a pruned turn's cancel and decisions may be
# held without a trace in the record: the tombstone keeps its turn id, the
# rest of the turn is gone.
_DISAGREEMENT = Statement(
    f"""
    WITH derived AS (
        SELECT DISTINCT ON (idempotency_key) idempotency_key, kind, turn_id
        FROM ({_DERIVED}) d ORDER BY idempotency_key, rank
    ), held AS (
        SELECT idempotency_key, kind, turn_id FROM session_keys WHERE session_id = :session_id
    )
    SELECT
      (SELECT d.idempotency_key FROM derived d
       LEFT JOIN held h ON h.idempotency_key = d.idempotency_key
       WHERE h.kind IS DISTINCT FROM d.kind OR h.turn_id IS DISTINCT FROM d.turn_id
       ORDER BY d.idempotency_key LIMIT 1) AS unheld,
      (SELECT h.idempotency_key FROM held h
       WHERE NOT EXISTS (SELECT 1 FROM derived d WHERE d.idempotency_key = h.idempotency_key)
         AND NOT (h.kind IN ({literals((KeyKind.CANCEL, KeyKind.DECISION))})
                  AND h.turn_id IN (SELECT turn_id FROM key_tombstones
                                    WHERE session_id = :session_id))
       ORDER BY h.idempotency_key LIMIT 1) AS stray
    """
)


async def rebuild(conn: Conn, *, session_id: uuid.UUID) -> None:
    """Fill a session's keys from its record (an import of a file that does
    not carry them writes the record row by row, not through the writes
    that take keys)."""
    await _REBUILD.execute(conn, session_id=session_id)


async def disagreement(conn: Conn, *, session_id: uuid.UUID) -> str | None:
    """How the session's keys disagree with its record, or None: what an
    import that carries the keys checks before it commits."""
    row = await _DISAGREEMENT.fetchrow(conn, session_id=session_id)
    assert row is not None  # a SELECT of scalar subqueries has its one row
    if row["unheld"] is not None:
        return f"the record implies key {row['unheld']!r}, which its keys do not hold as it does"
    if row["stray"] is not None:
        return f"key {row['stray']!r} names nothing in the record"
    return None
