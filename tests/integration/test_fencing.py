"""Work claiming and fencing, at the level of the statements every process runs."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from keyturn.db import leases
from keyturn.db.engine import connect, create_engine
from keyturn.domain import EventType, History, TurnStatus
from keyturn.runtime.admission import AdmissionOutcome, admit_turn
from keyturn.runtime.validation import TurnRequest
from tests.support import GraphQLClient, InProcessServer, admin


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    e = create_engine(database_url, pool_size=4)
    yield e
    await e.dispose()


async def queued_turn(engine: AsyncEngine, db: Any) -> uuid.UUID:
    sid = uuid.uuid4()
    await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'FULL')", sid)
    admission = await admit_turn(
        engine=engine, request=TurnRequest(sid, "k", "hello", History.FULL)
    )
    assert admission.outcome is AdmissionOutcome.ACCEPTED and admission.turn is not None
    return admission.turn.id


async def test_a_stale_owners_write_is_refused_and_recorded(engine: AsyncEngine, db: Any) -> None:
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
        assert not await leases.renew(conn, turn_id=turn_id, epoch=1, ttl_s=30)
        done = await leases.finish(
            conn,
            turn_id=turn_id,
            epoch=1,
            status=TurnStatus.COMPLETED,
            event_type=EventType.TURN_COMPLETED,
            output="late",
            error=None,
            data={},
        )
        assert done is None
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


async def test_a_new_claim_fences_out_the_previous_epoch(engine: AsyncEngine, db: Any) -> None:
    turn_id = await queued_turn(engine, db)
    async with connect(engine) as conn:
        [first] = (await leases.claim(conn, owner="a", ttl_s=30, limit=1)).turns
        assert (first.epoch, first.owner) == (1, "a")
        # A clean hand-back, then another process claims it: epoch 2.
        assert await leases.release(conn, turn_id=turn_id, epoch=1, owner="a") is not None
        [second] = (await leases.claim(conn, owner="b", ttl_s=30, limit=1)).turns
        assert (second.epoch, second.owner) == (2, "b")
        assert (
            await leases.finish(
                conn,
                turn_id=turn_id,
                epoch=1,
                status=TurnStatus.COMPLETED,
                event_type=EventType.TURN_COMPLETED,
                output="from a",
                error=None,
                data={},
            )
            is None
        )
        finished = await leases.finish(
            conn,
            turn_id=turn_id,
            epoch=2,
            status=TurnStatus.COMPLETED,
            event_type=EventType.TURN_COMPLETED,
            output="from b",
            error=None,
            data={},
        )
    assert finished is not None and finished.output == "from b"


async def test_concurrent_claimers_never_run_two_turns_of_one_session(
    engine: AsyncEngine, db: Any
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
    engine: AsyncEngine, db: Any, database_url: str
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

        async def finish() -> Any:
            async with connect(engine) as conn:
                return await leases.finish(
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
        finished = await asyncio.wait_for(finishing, 10)
        assert finished is not None and finished.status == "COMPLETED"
    finally:
        await holder.close()
        await prober.close()
