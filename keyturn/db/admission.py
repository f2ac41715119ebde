"""The admission writes: claim a key, insert the turn, append ``turn.started``.

A submission reads first (``_LOOKUP``: the session, the turn or tombstone
its key names), so a replay is that one statement and writes nothing. A new
key is then admitted by one statement in autocommit mode (``_ADMIT``), one
transaction and one round trip; its first insert is the key's row in
``session_keys`` (the session's one namespace of keys,
:mod:`keyturn.db.keys`), whose primary key alone decides which request owns
a key. A loser's statement returns no row and the caller reads the winner
with a separate statement.

A key also answers from ``key_tombstones`` once the retention sweeper pruned
its turn, and expires ``key_retention_s`` after its turn ended, judged on the
database clock by every read here: correctness never waits for the sweeper.
"""

from __future__ import annotations

import uuid
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

# The session row is locked first (FOR UPDATE), so concurrent admissions to one
# session queue on it and each reads the counter its predecessor committed: seq
# stays gapless and in commit order. Then the key (``k``): one namespace of keys
# per session (keyturn.db.keys), judged by its primary key against what is
# committed. A key any request holds (a pruned turn's too, until its tombstone
# is forgotten) inserts nothing, so the later CTEs see no row, insert no turn,
# bump nothing and append nothing.
_ADMIT = Statement(
    f"""
    WITH s AS (
        SELECT id, event_seq FROM sessions
        WHERE id = :session_id AND tenant = :tenant FOR UPDATE
    ), k AS (
        INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
        SELECT s.id, :key, {keys.TURN}, :turn_id
        FROM s
        -- multitask REJECT: nothing of the session may be queued or running.
        -- Sent after the session row is locked, in the same transaction
        -- (insert_turn), so this reads what the lock now guards.
        WHERE NOT CAST(:reject AS boolean)
           OR NOT EXISTS (SELECT 1 FROM turns b
                          WHERE b.session_id = s.id
                            AND b.status IN ({literals(ACTIVE_STATUSES)}))
        ON CONFLICT DO NOTHING
        RETURNING session_id
    ), ins AS (
        INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history,
                           status, admit_seq)
        SELECT :turn_id, s.id, :key, :fingerprint, :input, :history,
               {literal(TurnStatus.QUEUED)}, s.event_seq + 1
        FROM s JOIN k ON k.session_id = s.id
        RETURNING {columns(Turn)}
    ), {
        append_event(
            "ins",
            type=literal(EventType.TURN_STARTED),
            data="CAST(:data AS jsonb) || jsonb_build_object('seq', ins.admit_seq)",
            next_seq="ins.admit_seq",
        )
    }
    SELECT ins.* FROM ins, ev
    """
)

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


async def insert_turn(
    conn: Conn,
    *,
    tenant: str,
    turn_id: uuid.UUID,
    session_id: uuid.UUID,
    key: str,
    fingerprint: str,
    input: str,
    history: History,
    data: dict[str, Any],
    multitask: Multitask = Multitask.ENQUEUE,
) -> Admitted:
    """The new turn, or None when another submission already owns the key
    (or the session vanished, or, under multitask REJECT, it is busy).

    ENQUEUE is the one statement. REJECT and INTERRUPT lock the session row
    first, in a transaction, so that the statement's reads of the session's
    turns come after the lock (a statement's own reads see the moment it
    started, not the moment its lock was granted); INTERRUPT then cancels
    what is queued or running, in the same transaction."""
    params: dict[str, Any] = {
        "tenant": tenant,
        "turn_id": turn_id,
        "session_id": session_id,
        "key": key,
        "fingerprint": fingerprint,
        "input": input,
        "history": history,
        "data": orjson.dumps(data).decode(),
        "reject": multitask is Multitask.REJECT,
    }
    if multitask is Multitask.ENQUEUE:
        row = await _ADMIT.fetchrow(conn, **params)
        return Admitted(turn_from(row) if row is not None else None)
    async with conn.driver.transaction():
        if await _LOCK_SESSION.fetchrow(conn, session_id=session_id, tenant=tenant) is None:
            return Admitted(None)
        row = await _ADMIT.fetchrow(conn, **params)
        if row is None:
            return Admitted(None)
        turn = turn_from(row)
        cancelled: list[TurnRecord] = []
        if multitask is Multitask.INTERRUPT:
            cancelled = await cancels.cancel_active(
                conn,
                tenant=tenant,
                session_id=session_id,
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
