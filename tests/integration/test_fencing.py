"""Work claiming and fencing, at the level of the statements every process runs."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from keyturn.db import leases
from keyturn.db.engine import Engine, connect, create_engine
from keyturn.domain import EventType, History, TurnStatus
from keyturn.runtime.admission import AdmissionOutcome, admit_turn
from keyturn.runtime.finisher import Finisher
from keyturn.runtime.validation import TurnRequest
from tests.support import GraphQLClient, InProcessServer, admin


# One turn's renewal or finish, through the statements that take many.
async def renew_one(
    conn: Any, *, turn_id: uuid.UUID, epoch: int, ttl_s: float
) -> leases.Renewal | None:
    return (await leases.renew_many(conn, leases=[(turn_id, epoch)], ttl_s=ttl_s)).renewed.get(
        turn_id
    )


async def finish_one(
    conn: Any,
    *,
    turn_id: uuid.UUID,
    epoch: int,
    status: TurnStatus,
    event_type: EventType,
    output: str | None,
    error: str | None,
    data: dict[str, Any],
) -> bool:
    one = leases.Finish(turn_id, epoch, status, event_type, output, error, data)
    return turn_id in await leases.finish_many(conn, [one])


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[Engine]:
    e = create_engine(database_url, pool_size=4)
    yield e
    await e.dispose()


async def queued_turn(engine: Engine, db: Any) -> uuid.UUID:
    sid = uuid.uuid4()
    await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'FULL')", sid)
    admission = await admit_turn(
        engine=engine, request=TurnRequest(sid, "k", "hello", History.FULL)
    )
    assert admission.outcome is AdmissionOutcome.ACCEPTED and admission.turn is not None
    return admission.turn.id


async def test_a_stale_owners_write_is_refused_and_recorded(engine: Engine, db: Any) -> None:
    turn_id = await queued_turn(engine, db)
    async with connect(engine) as conn:
        [claimed] = (await leases.claim(conn, owner="old", ttl_s=30, limit=10)).turns
    assert claimed.id == turn_id and claimed.epoch == 1 and claimed.owner == "old"
    # Its lease runs out (the owner hung); a live process interrupts the turn.
    await db.execute("UPDATE turns SET lease_until = now() - interval '1 second'")
    async with connect(engine) as conn:
        [interrupted] = await leases.interrupt_expired(conn, by="sweeper")
        assert interrupted.status == "INTERRUPTED"
        # The old owner wakes up and tries to finish and to renew: both refused.
        assert not await renew_one(conn, turn_id=turn_id, epoch=1, ttl_s=30)
        done = await finish_one(
            conn,
            turn_id=turn_id,
            epoch=1,
            status=TurnStatus.COMPLETED,
            event_type=EventType.TURN_COMPLETED,
            output="late",
            error=None,
            data={},
        )
        assert not done
        await leases.record_refused_write(
            conn, turn_id=turn_id, epoch=1, attempted="turn.completed", by="old"
        )
    row = await db.fetchrow("SELECT status, output FROM turns WHERE id = $1", turn_id)
    assert (row["status"], row["output"]) == ("INTERRUPTED", None)
    events = await db.fetch(
        "SELECT seq, type, data FROM events WHERE turn_id = $1 ORDER BY seq", turn_id
    )
    assert [e["type"] for e in events] == [
        "turn.started",
        "turn.running",
        "turn.interrupted",
        "turn.write_refused",
    ]
    assert [e["seq"] for e in events] == [1, 2, 3, 4]


async def test_a_new_claim_fences_out_the_previous_epoch(engine: Engine, db: Any) -> None:
    turn_id = await queued_turn(engine, db)
    async with connect(engine) as conn:
        [first] = (await leases.claim(conn, owner="a", ttl_s=30, limit=1)).turns
        assert (first.epoch, first.owner) == (1, "a")
        # A clean hand-back, then another process claims it: epoch 2.
        assert await leases.release(conn, turn_id=turn_id, epoch=1, owner="a") is not None
        [second] = (await leases.claim(conn, owner="b", ttl_s=30, limit=1)).turns
        assert (second.epoch, second.owner) == (2, "b")
        assert (
            await finish_one(
                conn,
                turn_id=turn_id,
                epoch=1,
                status=TurnStatus.COMPLETED,
                event_type=EventType.TURN_COMPLETED,
                output="from a",
                error=None,
                data={},
            )
            is False
        )
        finished = await finish_one(
            conn,
            turn_id=turn_id,
            epoch=2,
            status=TurnStatus.COMPLETED,
            event_type=EventType.TURN_COMPLETED,
            output="from b",
            error=None,
            data={},
        )
    assert finished is True
    assert await db.fetchval("SELECT output FROM turns WHERE id = $1", turn_id) == "from b"


async def test_concurrent_claimers_never_run_two_turns_of_one_session(
    engine: Engine, db: Any
) -> None:
    sid = uuid.uuid4()
    await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'FULL')", sid)
    for n in range(5):
        await admit_turn(engine=engine, request=TurnRequest(sid, f"k{n}", "x", History.FULL))

    async def claimer(name: str) -> list[Any]:
        async with connect(engine) as conn:
            return (await leases.claim(conn, owner=name, ttl_s=30, limit=5)).turns

    results = await asyncio.gather(*(claimer(f"p{i}") for i in range(4)))
    claimed = [t for r in results for t in r]
    assert len(claimed) == 1
    assert claimed[0].admit_seq == 1  # the head of the queue, nothing else


async def test_a_draining_process_answers_retryable_and_claims_nothing(
    server: InProcessServer, client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    runtime = server.app.state.runtime
    runtime.drain()
    body = await client.raw(
        "mutation($i: SubmitTurnInput!) { submitTurn(input: $i) { __typename } }",
        {"i": {"sessionId": sid, "idempotencyKey": "k", "input": "x"}},
    )
    error = body["errors"][0]
    assert error["extensions"] == {"code": "SHUTTING_DOWN", "retryable": True}
    assert await db.fetchval("SELECT count(*) FROM turns") == 0


async def test_writers_lock_the_session_before_the_turn(
    engine: Engine, db: Any, database_url: str
) -> None:
    """Admission holds the session row while its ON CONFLICT check may wait on
    the transaction updating the turn that owns the key. So every writer must
    take the session row before the turn row, or the two wait on each other
    (a deadlock). Here a transaction holds the session row, as an admission
    would: the claim skips the session, and the finish waits for the session
    without having touched the turn."""
    turn_id = await queued_turn(engine, db)
    holder = await admin(database_url)
    prober = await admin(database_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute(
            "SELECT 1 FROM sessions s JOIN turns t ON t.session_id = s.id "
            "WHERE t.id = $1 FOR UPDATE OF s",
            turn_id,
        )
        async with connect(engine) as conn:
            # Skips the locked session at once (it must not wait for it while
            # holding the turn).
            claim = await asyncio.wait_for(leases.claim(conn, owner="a", ttl_s=30, limit=10), 10)
            assert claim.turns == []
        await tx.rollback()

        async with connect(engine) as conn:
            [claimed] = (await leases.claim(conn, owner="a", ttl_s=30, limit=10)).turns
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", claimed.session_id)

        async def finish() -> bool:
            async with connect(engine) as conn:
                return await finish_one(
                    conn,
                    turn_id=turn_id,
                    epoch=claimed.epoch,
                    status=TurnStatus.COMPLETED,
                    event_type=EventType.TURN_COMPLETED,
                    output="done",
                    error=None,
                    data={},
                )

        finishing = asyncio.create_task(finish())
        await asyncio.sleep(0.5)
        assert not finishing.done()  # waiting for the session row...
        async with prober.transaction():  # ...while the turn row is free
            locked = await prober.fetchval(
                "SELECT id FROM turns WHERE id = $1 FOR UPDATE NOWAIT", turn_id
            )
        assert locked == turn_id
        await tx.rollback()
        assert await asyncio.wait_for(finishing, 10) is True
        status = await db.fetchval("SELECT status FROM turns WHERE id = $1", turn_id)
        assert status == "COMPLETED"
    finally:
        await holder.close()
        await prober.close()


async def running_turns(engine: Engine, db: Any, count: int) -> list[Any]:
    """``count`` sessions, each with one turn claimed by owner ``a`` (epoch 1)."""
    for _ in range(count):
        await queued_turn(engine, db)
    async with connect(engine) as conn:
        turns = (await leases.claim(conn, owner="a", ttl_s=30, limit=count)).turns
    assert len(turns) == count
    return sorted(turns, key=lambda t: t.session_id)


def ending(turn: Any, *, epoch: int | None = None, delta: bool = False) -> leases.Finish:
    return leases.Finish(
        turn.id,
        turn.epoch if epoch is None else epoch,
        TurnStatus.COMPLETED,
        EventType.TURN_COMPLETED,
        f"out {turn.id}",
        None,
        {"status": "COMPLETED", "epoch": turn.epoch},
        {"text": "last piece", "index": 0, "epoch": turn.epoch} if delta else None,
    )


async def test_one_finish_statement_ends_several_turns_each_behind_its_own_fence(
    engine: Engine, db: Any
) -> None:
    one, stale, with_delta = await running_turns(engine, db, 3)
    async with connect(engine) as conn:
        done = await leases.finish_many(
            conn,
            [ending(one), ending(stale, epoch=stale.epoch + 1), ending(with_delta, delta=True)],
        )
    assert done == {one.id, with_delta.id}
    rows = await db.fetch("SELECT id, status, output FROM turns")
    assert {r["id"]: r["output"] for r in rows}[one.id] == f"out {one.id}"
    assert {r["id"]: r["status"] for r in rows} == {
        one.id: "COMPLETED",
        stale.id: "RUNNING",
        with_delta.id: "COMPLETED",
    }
    # Each session's events stay gapless, the delta just before its end.
    expected = {
        one.session_id: ["turn.started", "turn.running", "turn.completed"],
        stale.session_id: ["turn.started", "turn.running"],
        with_delta.session_id: ["turn.started", "turn.running", "turn.delta", "turn.completed"],
    }
    for session_id, types in expected.items():
        events = await db.fetch(
            "SELECT seq, type FROM events WHERE session_id = $1 ORDER BY seq", session_id
        )
        assert [e["type"] for e in events] == types
        assert [e["seq"] for e in events] == list(range(1, len(types) + 1))
        seq = await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1", session_id)
        assert seq == len(types)


async def test_finish_batches_over_the_same_sessions_in_opposite_orders_both_complete(
    engine: Engine, db: Any, database_url: str
) -> None:
    """Two batches that name the same sessions (each finishes three turns and
    carries stale finishes of the other's) lock them in one order, so neither
    waits for the other in a cycle (which PostgreSQL would break with an error)."""
    turns = await running_turns(engine, db, 6)
    first, second = turns[:3], turns[3:]
    batch_a = [ending(t) for t in first] + [ending(t, epoch=0) for t in second]
    batch_b = [ending(t) for t in reversed(second)] + [ending(t, epoch=0) for t in reversed(first)]
    holder = await admin(database_url)
    try:
        # A transaction holds the two middle sessions: a batch that locked in
        # the order it names its turns would take the sessions on its side of
        # them first and then wait for the other batch's, which waits for its.
        tx = holder.transaction()
        await tx.start()
        await holder.execute(
            "SELECT id FROM sessions WHERE id = ANY($1::uuid[]) FOR UPDATE",
            [t.session_id for t in turns[2:4]],
        )

        async def run(batch: list[leases.Finish]) -> set[uuid.UUID]:
            async with connect(engine) as conn:
                return await leases.finish_many(conn, batch)

        running = [asyncio.create_task(run(batch_a)), asyncio.create_task(run(batch_b))]
        await asyncio.sleep(0.3)
        await tx.rollback()
        done_a, done_b = await asyncio.wait_for(asyncio.gather(*running), 20)
    finally:
        await holder.close()
    assert done_a == {t.id for t in first} and done_b == {t.id for t in second}
    assert await db.fetchval("SELECT count(*) FROM turns WHERE status = 'COMPLETED'") == 6


async def test_one_renewal_statement_answers_each_lease_and_waits_for_no_lock(
    engine: Engine, db: Any, database_url: str
) -> None:
    held, lost, busy = await running_turns(engine, db, 3)
    await db.execute(
        "UPDATE turns SET lease_until = now() - interval '1 second' WHERE id = $1", lost.id
    )
    async with connect(engine) as conn:
        [interrupted] = await leases.interrupt_expired(conn, by="sweeper")
    assert interrupted.id == lost.id
    holder = await admin(database_url)
    try:
        # Another writer holds one turn's row (as a cancel or a finish would).
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM turns WHERE id = $1 FOR UPDATE", busy.id)
        pairs = [(t.id, t.epoch) for t in (held, lost, busy)]
        async with connect(engine) as conn:
            answer = await asyncio.wait_for(leases.renew_many(conn, leases=pairs, ttl_s=30), 5)
        assert set(answer.renewed) == {held.id}
        assert answer.refused == {lost.id}  # its lease passed on: the owner stops
        assert answer.busy == {busy.id}  # neither renewed nor lost: asked again
        await tx.rollback()
        async with connect(engine) as conn:
            again = await leases.renew_many(conn, leases=pairs, ttl_s=30)
        assert set(again.renewed) == {held.id, busy.id} and again.refused == {lost.id}
    finally:
        await holder.close()


async def test_turns_ending_together_share_one_finish_and_each_learns_its_outcome(
    engine: Engine, db: Any
) -> None:
    one, stale, other = await running_turns(engine, db, 3)
    finisher = Finisher(engine)
    outcomes = await asyncio.gather(
        finisher.finish(ending(one)),
        finisher.finish(ending(stale, epoch=0)),
        finisher.finish(ending(other)),
    )
    assert list(outcomes) == [True, False, True]
    # All three were handed over before the statement went out: one statement.
    assert finisher.statements == 1
