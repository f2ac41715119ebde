"""The writes of running turns: claim, renew, finish, interrupt, release.

Each is one short statement in autocommit mode. No row lock outlives its
statement, so nothing is locked while a model or a tool works. Every write for
a claimed turn names the epoch its claim received; a write whose epoch no
longer matches touches nothing (the caller records the refusal). Claims,
renewals and finishes take several turns in one statement, each row behind
its own epoch fence.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from keyturn.db.engine import Conn
from keyturn.db.failures import DRIVER_ERRORS, violated
from keyturn.db.records import TurnRecord, turn_from
from keyturn.db.sql import Statement, append_event, columns, literal, literals
from keyturn.db.tables import QUEUED_BY_AGE, Turn
from keyturn.domain import EventType, TurnStatus

QUEUED, RUNNING = literal(TurnStatus.QUEUED), literal(TurnStatus.RUNNING)
_U = columns(Turn, alias="u")

# Lock order, for every statement that changes a turn and appends an event:
# the session row first, then the turn row. Admission holds the session row
# while its ON CONFLICT check may wait for a transaction that is updating the
# turn holding the same key; a writer that took the turn first and then
# waited for the session would close a cycle (a deadlock PostgreSQL breaks
# after deadlock_timeout, with a stall and an error).
SESSION_OF_TURN = """
    s AS (
        SELECT sessions.id FROM sessions JOIN turns t ON t.session_id = sessions.id
        WHERE t.id = :turn_id
        FOR UPDATE OF sessions
    )"""

# Only the head of a session's queue is claimable, and only while nothing of
# its session runs or waits. Two ways to find the oldest ready heads:
#
# - ``near``: the oldest queued turns (at most _NEAR of them, walked one
#   index probe at a time along ix_turns_queued_age, whose predicate the
#   walk repeats: no other statement can read that index), each kept if it
#   heads its session and the session is free. When turns wait across many
#   sessions (one each, say), the oldest ones are heads and this alone fills
#   the claim, whatever the queue's size.
# - ``far``: every session's head, one index probe per session with queued
#   turns (a skip scan down ix_turns_queued, ``heads``), so O(sessions), not
#   O(queued). Run only when ``near`` found fewer than asked for (a one-time
#   filter: otherwise it is not executed at all), as when a few sessions hold
#   long queues and their oldest turns are all behind a running one.
#
# Both walks, and each test of a candidate (a scalar subquery, which the
# planner does not turn into a join), are index probes by construction, so
# their cost cannot grow with the queue when the table's statistics lag
# behind it: planned as joins and a LIMIT, a burst into a table last analyzed
# when nearly empty read every queued turn per claim, and the claim became
# most of the database's work. The walk along the age index steps past turns
# that tie exactly on (created_at, admit_seq); the tied one is still a head
# ``far`` finds, and the next claim's walk starts from the oldest again.
#
# A head locked by another claimer is skipped, never its successor. The
# partial unique index on RUNNING turns backs this up: if two claimers ever
# raced past the checks, one statement would fail.
_NEAR = 64
_FREE = f"""NOT EXISTS (SELECT 1 FROM turns r
                          WHERE r.session_id = {{head}}.session_id AND r.status = {RUNNING})
          -- A WAITING turn is still the head of its session: the queue waits
          -- behind it until a decision puts it back (QUEUED, in its place).
          AND NOT EXISTS (SELECT 1 FROM turns w
                          WHERE w.session_id = {{head}}.session_id
                            AND w.status = {literal(TurnStatus.WAITING)})"""
_CLAIM = Statement(
    f"""
    WITH RECURSIVE oldest AS (
        (SELECT id, session_id, admit_seq, created_at, 1 AS n FROM turns
         WHERE {QUEUED_BY_AGE}
         ORDER BY created_at, admit_seq
         LIMIT 1)
        UNION ALL
        SELECT x.id, x.session_id, x.admit_seq, x.created_at, o.n + 1 FROM oldest o
        CROSS JOIN LATERAL (SELECT id, session_id, admit_seq, created_at FROM turns
                            WHERE {QUEUED_BY_AGE}
                              AND (created_at, admit_seq) > (o.created_at, o.admit_seq)
                            ORDER BY created_at, admit_seq
                            LIMIT 1) x
        WHERE o.n < {_NEAR}
    ), near AS (
        SELECT o.id, o.session_id, o.admit_seq, o.created_at FROM oldest o
        WHERE o.admit_seq = (SELECT min(e.admit_seq) FROM turns e
                             WHERE e.session_id = o.session_id AND e.status = {QUEUED})
          AND {_FREE.format(head="o")}
        -- In the walk's order, oldest first, with no sort: the walk stops
        -- once the claim has its candidates.
        LIMIT :limit
    ), heads AS (
        (SELECT id, session_id, admit_seq, created_at FROM turns
         WHERE status = {QUEUED}
         ORDER BY session_id, admit_seq
         LIMIT 1)
        UNION ALL
        SELECT n.id, n.session_id, n.admit_seq, n.created_at FROM heads h
        CROSS JOIN LATERAL (SELECT id, session_id, admit_seq, created_at FROM turns
                            WHERE status = {QUEUED} AND session_id > h.session_id
                            ORDER BY session_id, admit_seq
                            LIMIT 1) n
    ), far AS (
        SELECT h.id, h.session_id, h.admit_seq, h.created_at FROM heads h
        WHERE (SELECT count(*) FROM near) < :limit
          AND {_FREE.format(head="h")}
        ORDER BY h.created_at, h.admit_seq
        LIMIT :limit
    ), ready AS (
        SELECT id, session_id FROM (SELECT * FROM near UNION SELECT * FROM far) x
        ORDER BY created_at, admit_seq
        LIMIT :limit
    ), s AS (
        SELECT id FROM sessions WHERE id IN (SELECT session_id FROM ready)
        FOR UPDATE SKIP LOCKED
    ), c AS (
        -- The status as the lock found it (the row's latest version): still
        -- queued, or taken meanwhile (cancelled, say).
        SELECT t.id, t.status FROM turns t
        JOIN ready r ON r.id = t.id JOIN s ON s.id = t.session_id
        FOR UPDATE OF t SKIP LOCKED
    ), u AS (
        -- Each row by its id: with the status tested on the turns read here
        -- instead, statistics taken while nothing was queued let the plan
        -- read every queued turn (ix_turns_queued) to find the few locked.
        UPDATE turns SET status = {RUNNING}, owner = :owner, epoch = turns.epoch + 1,
               started_at = now(), lease_until = now() + make_interval(secs => :ttl)
        FROM c WHERE turns.id = c.id AND c.status = {QUEUED}
        RETURNING turns.*
    ), {
        append_event(
            "u",
            type=literal(EventType.TURN_RUNNING),
            data="jsonb_build_object('owner', u.owner, 'epoch', u.epoch)",
        )
    }
    SELECT {_U} FROM u
    """
)

# One renewal for every turn a process runs, each row fenced by its own
# epoch. A row another transaction holds (a finish, a cancel, a sweep) is
# skipped rather than waited for: a renewal that waits on no lock can never
# close a cycle with the writers that take several turns, and the row read
# as still its owner's in the statement's snapshot is answered as busy (try
# again shortly), never as refused.
_RENEW = Statement(
    f"""
    WITH x AS (
        SELECT * FROM unnest(CAST(:turn_ids AS uuid[]), CAST(:epochs AS bigint[]))
            AS x(id, epoch)
    ), l AS (
        SELECT t.id FROM turns t JOIN x ON x.id = t.id AND x.epoch = t.epoch
        WHERE t.status = {RUNNING}
        FOR UPDATE OF t SKIP LOCKED
    ), u AS (
        UPDATE turns SET lease_until = now() + make_interval(secs => :ttl)
        FROM l WHERE turns.id = l.id
        RETURNING turns.id, turns.cancel_requested_at IS NOT NULL AS cancel_requested
    )
    SELECT x.id, u.id IS NOT NULL AS renewed, COALESCE(u.cancel_requested, false)
                AS cancel_requested,
           u.id IS NULL AND EXISTS (SELECT 1 FROM turns t
                                   WHERE t.id = x.id AND t.epoch = x.epoch
                                     AND t.status = {RUNNING}) AS busy
    FROM x LEFT JOIN u ON u.id = x.id
    """
)

# The ends of several running turns, each with its last turn.delta when the
# model left text not yet recorded (its delta not NULL): one statement, one
# commit, and per turn the delta's seq just before the end's. Each row keeps
# its own epoch fence; a row whose fence fails is left out of the answer,
# which is the ids of the turns ended: the worker has the rest (their rows
# read back and decoded were a few percent of a turn's run in the process).
# The sessions are locked in id order before any turn row (the lock order of
# every writer, above), so two batches, or a batch and an admission, cannot
# wait on each other in a cycle. One turn per session at most is RUNNING, so
# a session gets the events of one end.
_FINISH = Statement(
    f"""
    WITH x AS (
        SELECT * FROM unnest(
            CAST(:turn_ids AS uuid[]), CAST(:epochs AS bigint[]), CAST(:statuses AS text[]),
            CAST(:outputs AS text[]), CAST(:errors AS text[]), CAST(:types AS text[]),
            CAST(:datas AS jsonb[]), CAST(:deltas AS jsonb[])
        ) AS x(id, epoch, status, output, error, type, data, delta)
    ), s AS (
        -- Each turn's session by its id, one probe of the primary key per
        -- turn: as a join, a plan made when the tables were small walked
        -- every session's turns (ix_turns_session_admit) and kept doing so
        -- as they grew.
        SELECT sessions.id FROM sessions
        WHERE sessions.id IN (SELECT (SELECT t.session_id FROM turns t WHERE t.id = x.id)
                              FROM x)
        ORDER BY sessions.id
        FOR UPDATE OF sessions
    ), u AS (
        UPDATE turns SET status = x.status, output = x.output, error = x.error,
               completed_at = now(), lease_until = NULL
        FROM x, s
        WHERE turns.id = x.id AND turns.session_id = s.id
          AND turns.epoch = x.epoch AND turns.status = {RUNNING}
        RETURNING turns.id, turns.session_id, x.type AS end_type, x.data AS end_data,
                  x.delta AS end_delta
    ), e (turn_id, session_id, back, type, data) AS (
        SELECT id, session_id, 1, {literal(EventType.TURN_DELTA)}, end_delta
        FROM u WHERE end_delta IS NOT NULL
        UNION ALL
        SELECT id, session_id, 0, end_type, end_data FROM u
    ), bump AS (
        UPDATE sessions SET event_seq = sessions.event_seq + n.n
        FROM (SELECT session_id, count(*) AS n FROM e GROUP BY session_id) n
        WHERE sessions.id = n.session_id
        RETURNING sessions.id, sessions.event_seq
    ), ev AS (
        INSERT INTO events (session_id, turn_id, seq, type, data)
        SELECT e.session_id, e.turn_id, bump.event_seq - e.back, e.type, e.data
        FROM e JOIN bump ON bump.id = e.session_id
    )
    SELECT u.id FROM u
    """
)

# A lease that ran out means its owner stopped renewing: it died, hung, or lost
# the database. The turn is not run again; the record says what it shows.
_INTERRUPT_EXPIRED = Statement(
    f"""
    WITH x AS (
        SELECT id, session_id FROM turns
        WHERE status = {RUNNING} AND lease_until < now()
        ORDER BY lease_until
        LIMIT 100
    ), s AS (
        SELECT id FROM sessions WHERE id IN (SELECT session_id FROM x)
        FOR UPDATE SKIP LOCKED
    ), u AS (
        UPDATE turns SET status = {literal(TurnStatus.INTERRUPTED)}, completed_at = now(),
               error = 'interrupted: the process running this turn stopped renewing its lease',
               lease_until = NULL
        FROM x JOIN s ON s.id = x.session_id
        WHERE turns.id = x.id AND turns.status = {RUNNING} AND turns.lease_until < now()
        RETURNING turns.*
    ), {
        append_event(
            "u",
            type=literal(EventType.TURN_INTERRUPTED),
            data='''jsonb_build_object(
                   'owner', u.owner, 'epoch', u.epoch, 'by', CAST(:by AS text),
                   'outputChars', COALESCE(char_length(u.output), 0),
                   'lastEvent', (SELECT jsonb_build_object('seq', e.seq, 'type', e.type,
                                                           'createdAt', e.created_at)
                                 FROM events e WHERE e.turn_id = u.id
                                 ORDER BY e.seq DESC LIMIT 1))''',
        )
    }
    SELECT {_U} FROM u
    """
)

# A clean shutdown hands an unfinished turn back to the queue instead of
# marking it interrupted, as long as it has done nothing outside itself: a
# turn with a tool intent is never run again on its own, so it stays until
# its lease runs out and is interrupted (and its tool calls settled). Nor is
# a turn that asked for approval: it resumes from its record, and starting
# afresh would ask again a person who already decided. Nor is a turn that has
# streamed output: its deltas are its record, and a new run would stream a
# second reply beside them, so their concatenation would no longer be its
# output; it is interrupted with the text it recorded.
_RELEASE = Statement(
    f"""
    WITH {SESSION_OF_TURN}, u AS (
        UPDATE turns SET status = {QUEUED}, owner = NULL, lease_until = NULL,
               started_at = NULL, output = NULL
        FROM s
        WHERE turns.id = :turn_id AND turns.session_id = s.id
          AND turns.epoch = :epoch AND turns.status = {RUNNING}
          AND NOT EXISTS (SELECT 1 FROM events e
                          WHERE e.turn_id = :turn_id
                            AND e.type IN ({
        literals((EventType.TOOL_INTENT, EventType.TOOL_APPROVAL_REQUESTED, EventType.TURN_DELTA))
    }))
        RETURNING turns.*
    ), {
        append_event(
            "u",
            type=literal(EventType.TURN_RELEASED),
            data="jsonb_build_object('owner', CAST(:owner AS text), 'epoch', u.epoch)",
        )
    }
    SELECT {_U} FROM u
    """
)

# Not fenced: it records that a fenced write was refused, whatever the turn's
# state now. It still takes the session row before the turn's (the bump).
# Once per turn, write, owner and stale epoch: a refusal whose answer was lost
# is sent again on a fresh connection by the write's retry, which finds it
# here in the record and appends nothing (a second refusal of that write
# under that epoch would say nothing the first does not).
_REFUSED = Statement(
    f"""
    WITH t AS (
        SELECT id, session_id, epoch, owner, status FROM turns
        WHERE id = :turn_id
          AND NOT EXISTS (SELECT 1 FROM events e
                          WHERE e.turn_id = :turn_id
                            AND e.type = {literal(EventType.TURN_WRITE_REFUSED)}
                            AND e.data ->> 'attempted' = CAST(:attempted AS text)
                            AND e.data ->> 'by' = CAST(:by AS text)
                            AND (e.data ->> 'staleEpoch')::bigint = CAST(:epoch AS bigint))
    ),
    {
        append_event(
            "t",
            type=literal(EventType.TURN_WRITE_REFUSED),
            data='''jsonb_build_object(
                   'attempted', CAST(:attempted AS text), 'by', CAST(:by AS text),
                   'staleEpoch', CAST(:epoch AS bigint), 'currentEpoch', t.epoch,
                   'status', t.status)''',
        )
    }
    SELECT seq FROM ev
    """
)

# Settling a write whose answer was lost: the turns this owner holds (a claim
# that committed unseen leaves one it is not running), and whether a finish
# under this epoch and owner is already in the record.
_OWNED_RUNNING = Statement(
    f"""
    SELECT {columns(Turn)} FROM turns WHERE owner = :owner AND status = {RUNNING}
    """
)

_FINISHED_BY = Statement(
    """
    SELECT 1 FROM turns
    WHERE id = :turn_id AND epoch = :epoch AND owner = :owner AND status = :status
    """
)

# A sweep whose answer was lost: the turns this process's sweeps interrupted
# lately (``within`` seconds on the database clock, wider than the time since
# the sweep was sent), found along the index of ended turns.
_INTERRUPTED_BY = Statement(
    f"""
    SELECT {columns(Turn)} FROM turns
    WHERE status = {literal(TurnStatus.INTERRUPTED)}
      AND completed_at >= now() - make_interval(secs => :within)
      AND EXISTS (SELECT 1 FROM events e
                  WHERE e.turn_id = turns.id AND e.type = {literal(EventType.TURN_INTERRUPTED)}
                    AND e.data ->> 'by' = :by)
    """
)

# A release whose answer was lost: its turn.released, by this owner and epoch.
_RELEASED_BY = Statement(
    f"""
    SELECT 1 FROM events
    WHERE turn_id = :turn_id AND type = {literal(EventType.TURN_RELEASED)}
      AND data ->> 'owner' = :owner AND (data ->> 'epoch')::bigint = :epoch
    """
)

# The latest ``limit`` earlier turns a FULL history shows, oldest first: read
# newest first down the (session_id, admit_seq) index, so a long session costs
# no more than its window. Each comes with the tool results its record holds
# (one per call index, through the index on events by turn; a rejected call's
# refusal stands as its result), in one statement.
_HISTORY = Statement(
    f"""
    WITH recent AS (
        SELECT id, input, output, status, admit_seq FROM turns
        WHERE session_id = :session_id AND admit_seq < :admit_seq
          AND status IN ({
        literals((TurnStatus.COMPLETED, TurnStatus.INTERRUPTED, TurnStatus.CANCELLED))
    })
        ORDER BY admit_seq DESC
        LIMIT :limit
    )
    SELECT r.input, r.output, r.status,
           (SELECT COALESCE(jsonb_agg(c.data ORDER BY (c.data ->> 'index')::int), '[]')
            FROM (SELECT DISTINCT ON (e.data ->> 'index') e.data FROM events e
                  WHERE e.turn_id = r.id
                    AND e.type IN ({literals((EventType.TOOL_RESULT, EventType.TOOL_REJECTED))})
                  ORDER BY e.data ->> 'index', e.seq DESC) c) AS tools
    FROM recent r
    ORDER BY r.admit_seq
    """
)

ONE_RUNNING_PER_SESSION = "ux_turns_one_running_per_session"


@dataclass(frozen=True, slots=True)
class Claim:
    turns: list[TurnRecord]
    # Two claimers raced past the checks and the unique index on RUNNING turns
    # refused this one: nothing was claimed; try again.
    lost_race: bool = False


async def claim(conn: Conn, *, owner: str, ttl_s: float, limit: int) -> Claim:
    try:
        rows = await _CLAIM.fetch(conn, owner=owner, ttl=ttl_s, limit=limit)
    except DRIVER_ERRORS as error:
        if violated(error) == ONE_RUNNING_PER_SESSION:
            return Claim([], lost_race=True)
        raise
    return Claim([turn_from(r) for r in rows])


@dataclass(frozen=True, slots=True)
class Renewal:
    """A renewed lease, and whether the turn's cancel has been asked for
    meanwhile (the renewal is also the poll behind the cancel's wake-up)."""

    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class Renewals:
    """The answer to one renewal of several leases, by turn."""

    renewed: dict[uuid.UUID, Renewal]
    # Still its owner's but held by another writer this moment: not renewed
    # this time, not refused either; ask again soon.
    busy: frozenset[uuid.UUID]
    # The epoch or status no longer matched: the lease passed on.
    refused: frozenset[uuid.UUID]


async def renew_many(
    conn: Conn, *, leases: Sequence[tuple[uuid.UUID, int]], ttl_s: float
) -> Renewals:
    """Renew the leases of the ``(turn, epoch)`` pairs in one statement."""
    rows = await _RENEW.fetch(
        conn, turn_ids=[t for t, _ in leases], epochs=[e for _, e in leases], ttl=ttl_s
    )
    renewed = {r["id"]: Renewal(bool(r["cancel_requested"])) for r in rows if r["renewed"]}
    busy = frozenset(r["id"] for r in rows if r["busy"])
    refused = frozenset(r["id"] for r in rows if not r["renewed"] and not r["busy"])
    return Renewals(renewed, busy, refused)


@dataclass(frozen=True, slots=True)
class Finish:
    """The end of one running turn, as :func:`finish_many` writes it."""

    turn_id: uuid.UUID
    epoch: int
    status: TurnStatus
    event_type: EventType
    output: str | None
    error: str | None
    data: dict[str, Any]
    # The data of the turn's last ``turn.delta``, appended just before the end.
    delta: dict[str, Any] | None = None


async def finish_many(conn: Conn, finishes: Sequence[Finish]) -> set[uuid.UUID]:
    """The ids of the turns finished, in one statement; a turn whose epoch or
    status no longer matched is not among them."""
    rows = await _FINISH.fetch(
        conn,
        turn_ids=[f.turn_id for f in finishes],
        epochs=[f.epoch for f in finishes],
        statuses=[f.status.value for f in finishes],
        outputs=[f.output for f in finishes],
        errors=[f.error for f in finishes],
        types=[f.event_type.value for f in finishes],
        datas=[orjson.dumps(f.data).decode() for f in finishes],
        deltas=[orjson.dumps(f.delta).decode() if f.delta is not None else None for f in finishes],
    )
    return {row["id"] for row in rows}


async def interrupt_expired(conn: Conn, *, by: str) -> list[TurnRecord]:
    return [turn_from(r) for r in await _INTERRUPT_EXPIRED.fetch(conn, by=by)]


async def release(conn: Conn, *, turn_id: uuid.UUID, epoch: int, owner: str) -> TurnRecord | None:
    row = await _RELEASE.fetchrow(conn, turn_id=turn_id, epoch=epoch, owner=owner)
    return turn_from(row) if row is not None else None


async def record_refused_write(
    conn: Conn, *, turn_id: uuid.UUID, epoch: int, attempted: str, by: str
) -> bool:
    """Record that ``by``'s ``attempted`` write under ``epoch`` was refused;
    False when the record already says so (an earlier attempt whose answer
    was lost committed it)."""
    seq = await _REFUSED.fetchval(conn, turn_id=turn_id, epoch=epoch, attempted=attempted, by=by)
    return seq is not None


async def owned_running(conn: Conn, *, owner: str) -> list[TurnRecord]:
    return [turn_from(r) for r in await _OWNED_RUNNING.fetch(conn, owner=owner)]


async def finished_by(
    conn: Conn, *, turn_id: uuid.UUID, epoch: int, owner: str, status: TurnStatus
) -> bool:
    """Did ``owner`` already end the turn with ``status`` under ``epoch``?"""
    row = await _FINISHED_BY.fetchrow(
        conn, turn_id=turn_id, epoch=epoch, owner=owner, status=status
    )
    return row is not None


async def interrupted_by(conn: Conn, *, by: str, within_s: float) -> list[TurnRecord]:
    """Turns ``by``'s sweeps interrupted within the last ``within_s`` seconds."""
    return [turn_from(r) for r in await _INTERRUPTED_BY.fetch(conn, by=by, within=within_s)]


async def released_by(conn: Conn, *, turn_id: uuid.UUID, epoch: int, owner: str) -> bool:
    """Did ``owner`` already hand the turn back under ``epoch``?"""
    row = await _RELEASED_BY.fetchrow(conn, turn_id=turn_id, epoch=epoch, owner=owner)
    return row is not None


@dataclass(frozen=True, slots=True)
class PastTurnRow:
    input: str
    output: str | None
    status: TurnStatus
    # The data of the turn's tool.result events, by call index.
    tools: list[dict[str, Any]]


async def history(
    conn: Conn, *, session_id: uuid.UUID, admit_seq: int, limit: int
) -> list[PastTurnRow]:
    """The latest ``limit`` completed, interrupted or cancelled turns before
    ``admit_seq``, oldest first, with their recorded tool results."""
    rows = await _HISTORY.fetch(conn, session_id=session_id, admit_seq=admit_seq, limit=limit)
    return [
        PastTurnRow(r["input"], r["output"], TurnStatus(r["status"]), list(r["tools"]))
        for r in rows
    ]
