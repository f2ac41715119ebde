"""A turn admitted running (keyturn.db.admission with an owner,
keyturn.runtime.admitter with a runner): when the process's worker has a
slot free, a session's new turn that nothing of its session is ahead of is
written RUNNING in its admission's transaction, with the claim's own
record (owner, epoch 1, a lease, ``turn.running`` after ``turn.started``),
and started by that worker; anything else is admitted QUEUED, as it always
was, and waits for a claim. The record cannot tell the two apart but by
their timing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from keyturn.db.admission import NewTurn, admit_many
from keyturn.db.engine import Engine, connect, create_engine
from keyturn.db.records import TurnRecord
from keyturn.domain import History, TurnStatus
from keyturn.runtime.admitter import Admitter
from keyturn.runtime.validation import fingerprint
from tests.support.client import GraphQLClient

OWNER = "test-owner"


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[Engine]:
    e = create_engine(database_url, pool_size=4)
    yield e
    await e.dispose()


async def _session(db: Any) -> uuid.UUID:
    sid = uuid.uuid4()
    await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'NONE')", sid)
    return sid


def _new(sid: uuid.UUID, key: str) -> NewTurn:
    fp = fingerprint(input=key, history=History.NONE)
    return NewTurn(uuid.uuid4(), "", sid, key, fp, key, History.NONE, {"idempotencyKey": key})


async def _events(db: Any, sid: uuid.UUID) -> list[tuple[int, str, uuid.UUID, Any]]:
    rows = await db.fetch(
        "SELECT seq, type, turn_id, data FROM events WHERE session_id = $1 ORDER BY seq", sid
    )
    return [(r["seq"], r["type"], r["turn_id"], r["data"]) for r in rows]


class Slots:
    """A runner of a few slots that records what its admissions told it."""

    owner = OWNER
    lease_ttl_s = 30.0

    def __init__(self, free: int) -> None:
        self.free = free
        self.started: list[TurnRecord] = []
        self.lost = 0

    def reserve(self) -> bool:
        if self.free <= 0:
            return False
        self.free -= 1
        return True

    def admitted(self, turn: TurnRecord | None) -> None:
        if turn is None:
            self.free += 1
        else:
            self.started.append(turn)

    def admission_lost(self) -> None:
        self.free += 1
        self.lost += 1


async def test_an_idle_sessions_new_turn_is_admitted_running_with_its_claim(
    engine: Engine, db: Any
) -> None:
    sid = await _session(db)
    async with connect(engine) as conn:
        done = await admit_many(conn, [_new(sid, "a")], owner=OWNER, lease_ttl_s=30)
    (turn,) = done.values()
    assert turn.status is TurnStatus.RUNNING and turn.owner == OWNER and turn.epoch == 1
    assert turn.started_at is not None and turn.lease_until is not None
    assert turn.admit_seq == 1
    # As a claim would have left it: the lease on the database clock.
    lease = await db.fetchval(
        "SELECT extract(epoch FROM lease_until - started_at) FROM turns WHERE id = $1", turn.id
    )
    assert float(lease) == 30.0
    events = await _events(db, sid)
    assert [(s, t) for s, t, _, _ in events] == [(1, "turn.started"), (2, "turn.running")]
    assert all(turn_id == turn.id for _, _, turn_id, _ in events)
    assert '"owner": "test-owner"' in events[1][3] and '"epoch": 1' in events[1][3]
    assert await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1", sid) == 2


async def test_only_a_sessions_first_new_turn_runs_and_only_when_nothing_is_ahead(
    engine: Engine, db: Any
) -> None:
    sid = await _session(db)
    async with connect(engine) as conn:
        # Two rows of one session in one statement: the first runs, the
        # second queues behind it; the claim's event comes after both
        # turn.started, as a claim after this statement would have.
        first = await admit_many(conn, [_new(sid, "a"), _new(sid, "b")], owner=OWNER)
        # The session now has a running turn: a new one queues.
        later = await admit_many(conn, [_new(sid, "c")], owner=OWNER)
    by_key = {t.idempotency_key: t for t in [*first.values(), *later.values()]}
    assert {k: t.status for k, t in by_key.items()} == {
        "a": TurnStatus.RUNNING,
        "b": TurnStatus.QUEUED,
        "c": TurnStatus.QUEUED,
    }
    assert (by_key["b"].owner, by_key["b"].epoch, by_key["b"].started_at) == (None, 0, None)
    assert [t.admit_seq for t in (by_key["a"], by_key["b"], by_key["c"])] == [1, 2, 4]
    events = await _events(db, sid)
    assert [(s, t, turn_id) for s, t, turn_id, _ in events] == [
        (1, "turn.started", by_key["a"].id),
        (2, "turn.started", by_key["b"].id),
        (3, "turn.running", by_key["a"].id),
        (4, "turn.started", by_key["c"].id),
    ]

    # Without an owner nothing runs, whatever the session's state.
    idle = await _session(db)
    async with connect(engine) as conn:
        (plain,) = (await admit_many(conn, [_new(idle, "d")])).values()
    assert plain.status is TurnStatus.QUEUED and plain.owner is None


async def test_a_session_that_became_busy_while_the_statement_waited_queues_the_turn(
    engine: Engine, db: Any
) -> None:
    """The statement reads the session's turns at its snapshot, which may be
    older than its lock on the session: a turn another process admitted
    while this statement waited for that lock must keep the new turn
    queued behind it."""
    sid = await _session(db)
    tx = db.transaction()
    await tx.start()
    # Another process's admission, holding the session until it commits.
    await db.fetch("SELECT id FROM sessions WHERE id = $1 FOR UPDATE", sid)
    other = _new(sid, "theirs")
    await db.execute(
        "INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)"
        " VALUES ($1, 'theirs', 'TURN', $2)",
        sid,
        other.turn_id,
    )
    await db.execute(
        "INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history,"
        " status, admit_seq) VALUES ($1, $2, 'theirs', $3, 'theirs', 'NONE', 'QUEUED', 1)",
        other.turn_id,
        sid,
        other.fingerprint,
    )
    await db.execute(
        "INSERT INTO events (session_id, turn_id, seq, type, data)"
        " VALUES ($1, $2, 1, 'turn.started', '{}')",
        sid,
        other.turn_id,
    )
    await db.execute("UPDATE sessions SET event_seq = 1 WHERE id = $1", sid)

    async def ours() -> dict[uuid.UUID, TurnRecord]:
        async with connect(engine) as conn:
            return await admit_many(conn, [_new(sid, "ours")], owner=OWNER)

    waiting = asyncio.ensure_future(ours())
    try:
        # The statement has taken its snapshot and waits for the lock.
        for _ in range(200):
            # Read afresh: in a transaction the activity view is read once.
            await db.execute("SELECT pg_stat_clear_snapshot()")
            locked = await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if locked:
                break
            await asyncio.sleep(0.02)
        assert locked, "the admission never waited for the session's lock"
    finally:
        await tx.commit()
    (turn,) = (await asyncio.wait_for(waiting, 10)).values()
    assert turn.status is TurnStatus.QUEUED and turn.owner is None
    assert turn.admit_seq == 2
    events = await _events(db, sid)
    assert [(s, t) for s, t, _, _ in events] == [(1, "turn.started"), (2, "turn.started")]


async def test_the_admitter_starts_a_turn_only_in_a_slot_its_runner_holds(
    engine: Engine, db: Any
) -> None:
    first, second, third = [await _session(db) for _ in range(3)]
    slots = Slots(free=1)
    admitter = Admitter(engine, runner=slots)
    a = await admitter.admit(_new(first, "a"))
    # The one slot is taken: an idle session's turn is queued for a claim.
    b = await admitter.admit(_new(second, "b"))
    assert a is not None and a.status is TurnStatus.RUNNING and a.owner == OWNER
    assert b is not None and b.status is TurnStatus.QUEUED
    assert [t.id for t in slots.started] == [a.id] and slots.free == 0

    # A turn queued behind a running one gives its slot back.
    slots.free = 1
    c = await admitter.admit(_new(first, "c"))
    assert c is not None and c.status is TurnStatus.QUEUED and slots.free == 1

    # A statement the database refuses gives it back too, and the runner is
    # told to read what runs under its name.
    bad = _new(third, "bad")
    refused = NewTurn(bad.turn_id, "", third, "bad", bad.fingerprint, "no\x00nul", History.NONE, {})
    with pytest.raises(asyncpg.PostgresError):
        await admitter.admit(refused)
    assert slots.lost == 1 and slots.free == 1
    assert await db.fetchval("SELECT count(*) FROM turns WHERE session_id = $1", third) == 0


async def test_a_submission_to_an_idle_session_answers_running_and_completes(
    client: GraphQLClient,
) -> None:
    """Over the API: the answer already says RUNNING, under the process that
    admitted it, which runs the turn to its end; the next turn of the busy
    session is answered QUEUED and runs after it."""
    sid = await client.create_session("NONE")
    first = await client.submit(sid, "k1", "hello")
    second = await client.submit(sid, "k2", "again")
    assert first["turn"]["status"] == "RUNNING"
    assert second["turn"]["status"] == "QUEUED"
    ended = [
        await client.wait_for_status(answer["turn"]["id"], {"COMPLETED"})
        for answer in (first, second)
    ]
    # Both run by the one process: the first by its admission, the second
    # by a claim.
    assert ended[0]["owner"] is not None and ended[0]["owner"] == ended[1]["owner"]
    assert [t["epoch"] for t in ended] == [1, 1]
    session = await client.session(sid)
    events = [(e["node"]["type"], e["node"]["turnId"]) for e in session["events"]["edges"]]
    a, b = first["turn"]["id"], second["turn"]["id"]
    assert events[:3] == [("turn.started", a), ("turn.running", a), ("turn.started", b)]
    # The second was claimed after the first ended.
    assert events.index(("turn.running", b)) > events.index(("turn.completed", a))
