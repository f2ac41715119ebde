"""The admission writes: claim a key, insert the turn, append ``turn.started``.

A submission reads first (``_LOOKUP``: the session, the turn or tombstone
its key names), so a replay is that one statement and writes nothing. New
keys are then admitted by one statement in autocommit mode (``_ADMIT``), one
transaction and one round trip for as many as arrive together; its first
insert is each key's row in ``session_keys`` (the session's one namespace
of keys, :mod:`keyturn.db.keys`), whose primary key alone decides which
request owns a key. A loser's row is not admitted and the caller reads the
winner with a separate statement.

A key also answers from ``key_tombstones`` once the retention sweeper pruned
its turn, and expires ``key_retention_s`` after its turn ended, judged on the
database clock by every read here: correctness never waits for the sweeper.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from keyturn.db import cancels, keys
from keyturn.db.engine import Conn
from keyturn.db.records import Row, TurnRecord, turn_from
from keyturn.db.sql import Statement, append_event, columns, literal, literals
from keyturn.db.tables import Turn
from keyturn.domain import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    EventType,
    History,
    Multitask,
    TurnStatus,
)

# When the key of turn ``t`` stops answering replays (NULL: never, or not yet
# ended), whether that moment has passed, and the tombstone ``kt`` of a
# pruned turn. ``:key_retention_s`` NULL is forever.
_EXPIRY = f"""
    t.completed_at + make_interval(secs => CAST(:key_retention_s AS double precision))
        AS t_expires_at,
    COALESCE(t.status IN ({literals(TERMINAL_STATUSES)})
             AND t.completed_at + make_interval(
                 secs => CAST(:key_retention_s AS double precision)) <= now(),
             false) AS t_expired,
    kt.turn_id AS kt_turn_id, kt.ended_at AS kt_ended_at, kt.expired_at AS kt_expired_at,
    (SELECT k.turn_id FROM session_keys k
     -- Read only when no turn holds the key: a replay skips the probe (the
     -- condition on the outer row is a one-time filter ahead of the scan).
     WHERE t.id IS NULL
       AND k.session_id = {{session}} AND k.idempotency_key = :key
       AND k.kind <> {keys.TURN}) AS decided_turn_id
"""

_LOOKUP = Statement(
    f"""
    SELECT s.default_history AS session_default_history, s.multitask AS session_multitask,
           {columns(Turn, alias="t", prefix="t_")}, {_EXPIRY.format(session="s.id")}
    FROM sessions s
    LEFT JOIN turns t ON t.session_id = s.id AND t.idempotency_key = :key
    LEFT JOIN key_tombstones kt ON kt.session_id = s.id AND kt.idempotency_key = :key
    WHERE s.id = :session_id AND s.tenant = :tenant
    """
)


# Nothing of session ``s`` is queued, running or waiting (multitask REJECT):
# one probe of each status's partial index (keyturn.db.tables), never a walk
# through the session's ended turns or the whole queue. A min(), not NOT
# EXISTS: on a table never analyzed (a burst into a new database), NOT
# EXISTS of a queued turn was planned as a sequential scan of every turn,
# and min() is planned as the first entry of the session in the status's
# index (tests/integration/test_plan_shapes.py runs it on a table analyzed
# and on one never analyzed).
_IDLE = " AND ".join(
    f"""(SELECT min(b.admit_seq) FROM turns b
         WHERE b.session_id = s.id AND b.status = {literal(status)}) IS NULL"""
    for status in sorted(ACTIVE_STATUSES)
)


# New keys, one row of ``x`` each: the statement a lone submission sends,
# and the one concurrent submissions to a session share
# (keyturn.runtime.admitter).
# Their sessions are locked first (FOR UPDATE), in id order, so concurrent
# admissions to a session queue on its row and each reads the counter its
# predecessor committed (seq stays gapless and in commit order), and two
# statements that lock several sessions cannot deadlock. Then each key
# (``k``): one namespace of keys per session (keyturn.db.keys), judged by its
# primary key against what is committed, and against the rows before it in
# the same statement. A key any request holds (a pruned turn's too, until
# its tombstone is forgotten) inserts nothing, so that row gets no turn, no
# seq and no event. The admitted rows of a session take the seqs after its
# counter in the order given, and the counter moves past the last of them.
def _admit(guard: str) -> Statement:
    return Statement(
        f"""
    WITH x AS (
        SELECT * FROM unnest(
            CAST(:turn_ids AS uuid[]), CAST(:session_ids AS uuid[]), CAST(:tenants AS text[]),
            CAST(:keys AS text[]), CAST(:fingerprints AS text[]), CAST(:inputs AS text[]),
            CAST(:histories AS text[]), CAST(:datas AS jsonb[])
        ) WITH ORDINALITY
          AS x(turn_id, session_id, tenant, key, fingerprint, input, history, data, n)
    ), s AS (
        SELECT id, tenant, event_seq FROM sessions
        WHERE id IN (SELECT session_id FROM x)
        ORDER BY id
        FOR UPDATE
    ), k AS (
        INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
        SELECT x.session_id, x.key, {keys.TURN}, x.turn_id
        FROM x JOIN s ON s.id = x.session_id AND s.tenant = x.tenant
        {guard}
        ORDER BY x.n
        ON CONFLICT DO NOTHING
        RETURNING turn_id
    ), a AS (
        SELECT x.*, s.event_seq + row_number() OVER (PARTITION BY x.session_id ORDER BY x.n)
                    AS admit_seq
        FROM x JOIN k ON k.turn_id = x.turn_id JOIN s ON s.id = x.session_id
    ), ins AS (
        INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history,
                           status, admit_seq)
        SELECT turn_id, session_id, key, fingerprint, input, history,
               {literal(TurnStatus.QUEUED)}, admit_seq
        FROM a
        RETURNING {columns(Turn)}
    ), bump AS (
        UPDATE sessions SET event_seq = m.last
        FROM (SELECT session_id, max(admit_seq) AS last FROM a GROUP BY session_id) m
        WHERE sessions.id = m.session_id
    ), ev AS (
        INSERT INTO events (session_id, turn_id, seq, type, data)
        SELECT session_id, turn_id, admit_seq, {literal(EventType.TURN_STARTED)},
               data || jsonb_build_object('seq', admit_seq)
        FROM a
    )
    SELECT * FROM ins
    """
    )


# The same for one new key, the statement a lone submission sends (most of
# them: a session rarely has two in flight). Scalar parameters instead of
# one-element arrays, and no joins between the arrays, the keys and the
# locked rows: PostgreSQL plans the batched form's joins for rows it cannot
# count (hashes, a sort, a window) and builds those nodes on every call
# (python -m bench.cpu new, the database column; bench/README.md). What it
# writes is what the batched form writes for one row
# (tests/integration/test_admitter.py sends the same submissions through
# both and compares the answers and the record).
def _admit_one(guard: str) -> Statement:
    return Statement(
        f"""
    WITH s AS (
        SELECT id, event_seq FROM sessions
        WHERE id = :session_id AND tenant = :tenant
        FOR UPDATE
    ), k AS (
        INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
        SELECT s.id, :key, {keys.TURN}, CAST(:turn_id AS uuid) FROM s
        {guard}
        ON CONFLICT DO NOTHING
        RETURNING session_id
    ), ins AS (
        INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history,
                           status, admit_seq)
        SELECT CAST(:turn_id AS uuid), s.id, :key, :fingerprint, :input, :history,
               {literal(TurnStatus.QUEUED)}, s.event_seq + 1
        FROM s JOIN k ON k.session_id = s.id
        RETURNING {columns(Turn)}
    ), {
            append_event(
                "ins",
                type=literal(EventType.TURN_STARTED),
                data="CAST(:data AS jsonb) || jsonb_build_object('seq', bump.event_seq)",
                next_seq="ins.admit_seq",
            )
        }
    SELECT * FROM ins
    """
    )


# Two statements, not one with a flag: with REJECT's check behind a parameter,
# PostgreSQL's generic plan kept the check's three subplans, costed above a
# plan made for each call's values, so it planned every admission anew
# (planning took as long as running it; pg_stat_statements' plans and
# total_plan_time). Without them the cached generic plan is used.
_ADMIT = _admit("")
# multitask REJECT: nothing of the session may be queued or running. Sent
# after the session row is locked, in the same transaction (insert_turn), so
# this reads what the lock now guards.
_ADMIT_IF_IDLE = _admit(f"WHERE {_IDLE}")
_ADMIT_ONE = _admit_one("")
_ADMIT_ONE_IF_IDLE = _admit_one(f"WHERE {_IDLE}")

_BY_KEY = Statement(
    f"""
    SELECT {columns(Turn, alias="t", prefix="t_")}, {_EXPIRY.format(session="k.session_id")}
    FROM (SELECT CAST(:session_id AS uuid) AS session_id) k
    LEFT JOIN turns t ON t.session_id = k.session_id AND t.idempotency_key = :key
    LEFT JOIN key_tombstones kt ON kt.session_id = k.session_id AND kt.idempotency_key = :key
    """
)


@dataclass(frozen=True, slots=True)
class Expiry:
    """A key that no longer answers replays: the turn it named (perhaps
    pruned), when that turn ended and when the key expired."""

    turn_id: uuid.UUID
    ended_at: datetime
    expired_at: datetime


@dataclass(frozen=True, slots=True)
class KeyState:
    """What the record holds for a key: the turn it names, and whether the
    key has expired (then ``existing`` may be None: the turn was pruned)."""

    existing: TurnRecord | None
    expiry: Expiry | None
    # A decision that took the key: the turn it cancelled or resolved.
    decided_turn_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class AdmissionLookup:
    """What the record says before a write: does the session exist, and does
    the key already name a turn in it."""

    session_found: bool
    default_history: History | None
    key: KeyState
    multitask: Multitask = Multitask.ENQUEUE


def _key_state(row: Row) -> KeyState:
    if row["kt_turn_id"] is not None:
        # Pruned: nothing is left to replay, whatever the retention is now.
        return KeyState(None, Expiry(row["kt_turn_id"], row["kt_ended_at"], row["kt_expired_at"]))
    if row["t_id"] is None:
        return KeyState(None, None, row["decided_turn_id"])
    turn = turn_from(row, "t_")
    if row["t_expired"] and turn.completed_at is not None:
        return KeyState(turn, Expiry(turn.id, turn.completed_at, row["t_expires_at"]))
    return KeyState(turn, None)


async def lookup(
    conn: Conn, *, tenant: str, session_id: uuid.UUID, key: str, key_retention_s: int | None
) -> AdmissionLookup:
    row = await _LOOKUP.fetchrow(
        conn,
        tenant=tenant,
        session_id=session_id,
        key=key,
        key_retention_s=_seconds(key_retention_s),
    )
    return _lookup_from(row)


def _lookup_from(row: Row | None) -> AdmissionLookup:
    if row is None:
        return AdmissionLookup(False, None, KeyState(None, None))
    return AdmissionLookup(
        True,
        History(row["session_default_history"]),
        _key_state(row),
        Multitask(row["session_multitask"]),
    )


def _seconds(retention_s: int | None) -> float | None:
    return float(retention_s) if retention_s is not None else None


@dataclass(frozen=True, slots=True)
class NewTurn:
    """A new key's turn, as :func:`admit_many` writes it."""

    turn_id: uuid.UUID
    tenant: str
    session_id: uuid.UUID
    key: str
    fingerprint: str
    input: str
    history: History
    data: dict[str, Any]  # turn.started's, without its seq


async def admit_many(
    conn: Conn, new: Sequence[NewTurn], *, reject: bool = False
) -> dict[uuid.UUID, TurnRecord]:
    """The turns admitted, by id, in one statement (the one-row form for a
    lone key): a row whose key another request already holds (or whose
    session is gone, or busy under ``reject``) is not among them."""
    if len(new) != 1:
        return await _admit_rows(conn, new, reject=reject)
    one = new[0]
    rows = await (_ADMIT_ONE_IF_IDLE if reject else _ADMIT_ONE).fetch(
        conn,
        turn_id=one.turn_id,
        session_id=one.session_id,
        tenant=one.tenant,
        key=one.key,
        fingerprint=one.fingerprint,
        input=one.input,
        history=one.history.value,
        data=orjson.dumps(one.data).decode(),
    )
    return {turn.id: turn for turn in map(turn_from, rows)}


async def _admit_rows(
    conn: Conn, new: Sequence[NewTurn], *, reject: bool
) -> dict[uuid.UUID, TurnRecord]:
    rows = await (_ADMIT_IF_IDLE if reject else _ADMIT).fetch(
        conn,
        turn_ids=[n.turn_id for n in new],
        session_ids=[n.session_id for n in new],
        tenants=[n.tenant for n in new],
        keys=[n.key for n in new],
        fingerprints=[n.fingerprint for n in new],
        inputs=[n.input for n in new],
        histories=[n.history.value for n in new],
        datas=[orjson.dumps(n.data).decode() for n in new],
    )
    return {turn.id: turn for turn in map(turn_from, rows)}


async def insert_turn(conn: Conn, new: NewTurn, *, multitask: Multitask) -> Admitted:
    """The new turn under REJECT or INTERRUPT, or None when another
    submission already owns the key (or the session vanished, or, under
    REJECT, it is busy). ENQUEUE's turns are admitted by :func:`admit_many`
    alone (keyturn.runtime.admitter).

    The session row is locked first, in a transaction, so that the
    statement's reads of the session's turns come after the lock (a
    statement's own reads see the moment it started, not the moment its lock
    was granted); INTERRUPT then cancels what is queued or running, in the
    same transaction."""
    async with conn.driver.transaction():
        if await _LOCK_SESSION.fetchrow(conn, session_id=new.session_id, tenant=new.tenant) is None:
            return Admitted(None)
        turn = (await admit_many(conn, [new], reject=multitask is Multitask.REJECT)).get(
            new.turn_id
        )
        if turn is None:
            return Admitted(None)
        cancelled: list[TurnRecord] = []
        if multitask is Multitask.INTERRUPT:
            cancelled = await cancels.cancel_active(
                conn,
                tenant=new.tenant,
                session_id=new.session_id,
                except_id=turn.id,
                reason=f"interrupted by turn {turn.id} (multitask INTERRUPT)",
            )
        return Admitted(turn, tuple(cancelled))


_LOCK_SESSION = Statement(
    "SELECT id FROM sessions WHERE id = :session_id AND tenant = :tenant FOR UPDATE"
)


_BUSY = Statement(
    f"""
    SELECT id FROM turns
    WHERE session_id = :session_id AND status IN ({literals(ACTIVE_STATUSES)})
    ORDER BY admit_seq LIMIT 1
    """
)


async def busy_turn(conn: Conn, *, session_id: uuid.UUID) -> uuid.UUID | None:
    """The session's first queued, waiting or running turn, if any."""
    row = await _BUSY.fetchrow(conn, session_id=session_id)
    return row["id"] if row is not None else None


@dataclass(frozen=True, slots=True)
class Admitted:
    turn: TurnRecord | None  # None: nothing was written
    cancelled: tuple[TurnRecord, ...] = ()  # INTERRUPT: the turns cancelled or asked to stop


async def key_state(
    conn: Conn, *, session_id: uuid.UUID, key: str, key_retention_s: int | None
) -> KeyState:
    """The turn (or tombstone) a key names now, read by the natural key."""
    row = await _BY_KEY.fetchrow(
        conn, session_id=session_id, key=key, key_retention_s=_seconds(key_retention_s)
    )
    return _key_state(row) if row is not None else KeyState(None, None)
