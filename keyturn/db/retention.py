"""The retention sweeper's statements: prune ended turns to tombstones, and
forget old tombstones, a bounded batch per statement.

Each batch is one statement in one short transaction (the sweeper's): a
crash or a cancel loses at most the batch in flight, which rolls back whole,
and the next batch starts again from what is committed. A batch of turns is
bounded twice: by its turns (``:batch``) and by the events it blanks
(``:batch_events``, a turn above it alone), so the rows it rewrites, and the
WAL it writes, stay bounded however long the turns streamed. A batch
locks the sessions of its rows (in id order, ``FOR UPDATE SKIP LOCKED``),
the lock admission takes first: moving a key from ``turns`` to
``key_tombstones`` and admitting under that key never interleave, and a
session busy with an admission is skipped, not waited for, and pruned by a
later batch. Two processes sweeping at once skip each other's sessions.

A pruned turn's events stay, so ``seq`` stays gapless: each keeps its seq,
type and time, its data becomes ``{"pruned": true}`` and its turn id null.
Turns a resolution names (``resolveInterruptedTurn``: the interrupted turn
and its retry) are kept whole, with their events.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from keyturn.db import keys
from keyturn.db.engine import Conn
from keyturn.db.sql import Statement, literals
from keyturn.domain import TERMINAL_STATUSES

# Turns whose content may go: ended more than ``:turn_retention_s`` ago and
# named by no resolution. Oldest first, along ix_turns_ended.
_PRUNABLE = f"""
    SELECT t.id, t.session_id, t.completed_at FROM turns t
    WHERE t.status IN ({literals(TERMINAL_STATUSES)})
      AND t.completed_at < now() - make_interval(
          secs => CAST(:turn_retention_s AS double precision))
      AND NOT EXISTS (SELECT 1 FROM resolutions r WHERE r.turn_id = t.id)
      AND NOT EXISTS (SELECT 1 FROM resolutions r WHERE r.new_turn_id = t.id)
"""

# Tombstones that may go: their turn was pruned more than
# ``:tombstone_retention_s`` ago.
_FORGETTABLE = """
    SELECT k.session_id, k.idempotency_key, k.pruned_at FROM key_tombstones k
    WHERE k.pruned_at < now() - make_interval(
        secs => CAST(:tombstone_retention_s AS double precision))
"""

_PRUNE_TURNS = Statement(
    f"""
    WITH oldest AS (
        {_PRUNABLE}
        ORDER BY t.completed_at
        LIMIT :batch
    ), counted AS (
        -- Each turn's events, counted no further than the bound: a turn of a
        -- million events costs the count of one bound.
        SELECT o.id, o.session_id, o.completed_at,
               (SELECT count(*) FROM (SELECT 1 FROM events e WHERE e.turn_id = o.id
                                      LIMIT CAST(:batch_events AS bigint) + 1) n) AS events
        FROM oldest o
    ), running AS (
        SELECT c.id, c.session_id,
               sum(c.events) OVER w AS upto, row_number() OVER w AS nth
        FROM counted c
        WINDOW w AS (ORDER BY c.completed_at, c.id)
    ), candidates AS (
        -- The oldest turns whose events fit the bound together; the oldest
        -- turn always, however many it has.
        SELECT id, session_id FROM running WHERE upto <= CAST(:batch_events AS bigint) OR nth = 1
    ), locked AS (
        SELECT s.id FROM sessions s WHERE s.id IN (SELECT session_id FROM candidates)
        ORDER BY s.id FOR UPDATE SKIP LOCKED
    ), victims AS (
        SELECT c.id FROM candidates c JOIN locked l ON l.id = c.session_id
    ), blanked AS (
        UPDATE events e SET data = '{{"pruned": true}}'::jsonb, turn_id = NULL
        FROM victims v WHERE e.turn_id = v.id
        RETURNING 1
    ), gone AS (
        DELETE FROM turns t USING victims v WHERE t.id = v.id
        RETURNING t.id, t.session_id, t.idempotency_key, t.fingerprint, t.completed_at
    ), stones AS (
        INSERT INTO key_tombstones (session_id, idempotency_key, fingerprint, turn_id,
                                    ended_at, expired_at)
        SELECT session_id, idempotency_key, fingerprint, id, completed_at,
               completed_at + make_interval(secs => CAST(:key_retention_s AS double precision))
        FROM gone
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM candidates) AS candidates,
           (SELECT count(*) FROM gone) AS turns,
           (SELECT count(*) FROM blanked) AS events,
           (SELECT count(*) FROM stones) AS tombstones
    """
)

_FORGET_TOMBSTONES = Statement(
    f"""
    WITH candidates AS (
        {_FORGETTABLE}
        ORDER BY k.pruned_at
        LIMIT :batch
    ), locked AS (
        SELECT s.id FROM sessions s WHERE s.id IN (SELECT session_id FROM candidates)
        ORDER BY s.id FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM key_tombstones k USING candidates c, locked l
        WHERE l.id = c.session_id
          AND k.session_id = c.session_id AND k.idempotency_key = c.idempotency_key
        RETURNING k.session_id, k.idempotency_key, k.turn_id
    ), freed AS (
        -- The key of the tombstone, and the keys that cancelled or decided its
        -- turn, are free from now on (keyturn.db.keys).
        DELETE FROM session_keys sk USING gone g
        WHERE sk.session_id = g.session_id
          AND (sk.idempotency_key = g.idempotency_key
               OR (sk.turn_id = g.turn_id AND sk.kind <> {keys.TURN}))
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM candidates) AS candidates, (SELECT count(*) FROM gone) AS gone
    """
)

_PREVIEW_TURNS = Statement(
    f"""
    WITH c AS ({_PRUNABLE})
    SELECT (SELECT count(*) FROM c) AS count,
           (SELECT min(completed_at) FROM c) AS oldest,
           (SELECT max(completed_at) FROM c) AS newest,
           (SELECT count(*) FROM events e JOIN c ON e.turn_id = c.id) AS events
    """
)

_PREVIEW_TOMBSTONES = Statement(
    f"""
    WITH c AS ({_FORGETTABLE})
    SELECT count(*) AS count, min(pruned_at) AS oldest, max(pruned_at) AS newest FROM c
    """
)


@dataclass(frozen=True, slots=True)
class TurnBatch:
    candidates: int  # prunable turns the batch chose (within both bounds)
    turns: int  # pruned: moved to tombstones
    events: int  # their events, data blanked
    tombstones: int  # tombstones written (one per pruned turn)


@dataclass(frozen=True, slots=True)
class TombstoneBatch:
    candidates: int
    forgotten: int


@dataclass(frozen=True, slots=True)
class Span:
    """How many rows, and the oldest and newest of their times."""

    count: int
    oldest: datetime | None
    newest: datetime | None


async def prune_turns(
    conn: Conn, *, turn_retention_s: int, key_retention_s: int, batch: int, batch_events: int
) -> TurnBatch:
    row = await _PRUNE_TURNS.fetchrow(
        conn,
        turn_retention_s=float(turn_retention_s),
        key_retention_s=float(key_retention_s),
        batch=batch,
        batch_events=batch_events,
    )
    assert row is not None  # an aggregate always has its row
    return TurnBatch(row["candidates"], row["turns"], row["events"], row["tombstones"])


async def forget_tombstones(
    conn: Conn, *, tombstone_retention_s: int, batch: int
) -> TombstoneBatch:
    row = await _FORGET_TOMBSTONES.fetchrow(
        conn, tombstone_retention_s=float(tombstone_retention_s), batch=batch
    )
    assert row is not None
    return TombstoneBatch(row["candidates"], row["gone"])


async def preview_turns(conn: Conn, *, turn_retention_s: int) -> tuple[Span, int]:
    """The turns a pass would prune now, and how many events they have."""
    row = await _PREVIEW_TURNS.fetchrow(conn, turn_retention_s=float(turn_retention_s))
    assert row is not None
    return Span(row["count"], row["oldest"], row["newest"]), row["events"]


async def preview_tombstones(conn: Conn, *, tombstone_retention_s: int) -> Span:
    """The tombstones a pass would forget now."""
    row = await _PREVIEW_TOMBSTONES.fetchrow(
        conn, tombstone_retention_s=float(tombstone_retention_s)
    )
    assert row is not None
    return Span(row["count"], row["oldest"], row["newest"])
