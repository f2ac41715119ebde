"""The worker under errors it did not expect and a store that answers slowly:
a lease is renewed through any error, and settling unknown tool outcomes never
holds up the claiming of other turns."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from keyturn.db import leases
from keyturn.db.engine import create_engine
from keyturn.runtime.bus import EventBus
from keyturn.runtime.model import FixtureModel
from keyturn.runtime.tools import SyntheticWrite
from keyturn.runtime.worker import Worker, WorkerSettings
from tests.integration.test_tool_ledger import held_at, settled, take_over, turn
from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process


async def test_a_renewal_that_raises_an_unexpected_error_is_retried(
    server: InProcessServer, client: GraphQLClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    renew = leases.renew_many
    failures: list[BaseException] = []

    async def renew_failing_once(conn: Any, **kwargs: Any) -> leases.Renewals:
        if not failures:
            error = RuntimeError("an error nobody classified")
            failures.append(error)
            raise error
        return await renew(conn, **kwargs)

    monkeypatch.setattr(leases, "renew_many", renew_failing_once)
    sid = await client.create_session()
    # Longer than the lease (3s): it completes only if the lease is renewed.
    tid = (await client.submit(sid, "k", "/sleep 5000"))["turn"]["id"]
    done = await client.wait_for_status(tid, {"COMPLETED", "INTERRUPTED", "FAILED"}, within=30)
    assert failures, "the renewal never raised"
    assert done["status"] == "COMPLETED", done
    assert "turn.interrupted" not in [e["type"] for e in done["events"]]


async def test_a_lost_lease_stops_the_reply_where_it_is(
    server: InProcessServer, client: GraphQLClient, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The reply would hold the turn for a minute and write nothing meanwhile:
    # only the refused renewal (every 0.5 s) can tell the worker to let go.
    worker = server.app.state.runtime.worker
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", "/sleep 60000"))["turn"]["id"]
    await held_at(db, tid, 2)  # turn.started, turn.running
    assert worker.running_count == 1
    await take_over(db, tid)
    deadline = asyncio.get_running_loop().time() + 10
    while worker.running_count:
        assert asyncio.get_running_loop().time() < deadline, "the worker kept the turn"
        await asyncio.sleep(0.05)
    assert any("lease lost while running" in r.getMessage() for r in caplog.records)
    done = await client.wait_for_status(tid, {"INTERRUPTED", "COMPLETED", "FAILED"}, within=10)
    assert [e["type"] for e in done["events"]] == [
        "turn.started",
        "turn.running",
        "turn.interrupted",
    ]
    # The worker goes on: the session's next turn runs to its end.
    nxt = (await client.submit(sid, "k2", "hello"))["turn"]["id"]
    assert (await client.wait_for_status(nxt, {"COMPLETED"}, within=10))["output"]


@pytest.fixture
async def holding_server(database_url: str) -> AsyncIterator[InProcessServer]:
    """Tool calls hold after their intent, as if the process had hung there."""
    settings = fast_settings(crash_at="after_intent:0", crash_after=1_000_000)
    async with serve_in_process(database_url, settings) as srv:
        yield srv


async def interrupted_write(client: GraphQLClient, db: Any) -> str:
    """A turn of one ``/write`` interrupted after its call's intent (taken
    over by another owner), its outcome for the store to settle; its id."""
    sid = await client.create_session()
    w = (await client.submit(sid, "w", "/write a=1"))["turn"]["id"]
    await held_at(db, w, 4)  # started, running, planned, intent
    await take_over(db, w)
    await client.wait_for_status(w, {"INTERRUPTED"})
    return str(w)


async def test_a_slow_store_does_not_hold_up_other_sessions(
    holding_server: InProcessServer, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = GraphQLClient(holding_server.url)
    store_answers = asyncio.Event()
    asked: list[str] = []
    applied = SyntheticWrite.applied

    async def slow_applied(self: SyntheticWrite, effect_key: str) -> bool:
        asked.append(effect_key)
        await store_answers.wait()
        return await applied(self, effect_key)

    monkeypatch.setattr(SyntheticWrite, "applied", slow_applied)
    try:
        w = await interrupted_write(client, db)
        # The store is being asked and does not answer; other sessions' turns run.
        other = await client.create_session()
        plain = [
            (await client.submit(other, f"p{i}", f"hello {i}"))["turn"]["id"] for i in range(3)
        ]
        for tid in plain:
            assert (await client.wait_for_status(tid, {"COMPLETED"}, within=10))["output"]
        assert asked and set(asked) == {f"{w}/0"}
        # Once the store answers, the interrupted turn's call is settled.
        store_answers.set()
        t = await settled(client, w, within=60)
        assert [c["state"] for c in t["toolCalls"]] == ["RECONCILED_NOT_APPLIED"]
        reconciled = [e for e in t["events"] if e["type"] == "tool.reconciled"]
        assert len(reconciled) == 1
    finally:
        store_answers.set()
        await client.close()


async def test_a_question_that_times_out_is_asked_again_and_settles(
    holding_server: InProcessServer, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The runner's own bound on one question, made short (it is 10 s).
    holding_server.app.state.runtime.worker.runner.question_timeout_s = 0.5
    client = GraphQLClient(holding_server.url)
    asked: list[str] = []
    timed_out = asyncio.Event()
    others_ran = asyncio.Event()
    applied = SyntheticWrite.applied

    async def hangs_the_first_time(self: SyntheticWrite, effect_key: str) -> bool:
        asked.append(effect_key)
        if len(asked) > 1:
            return await applied(self, effect_key)
        try:
            await asyncio.Future()  # the store never answers this one
        except asyncio.CancelledError:
            # The runner's timeout gave up on it. It finishes giving up only
            # once other sessions' turns have run, so they ran while this
            # question was out and unanswered.
            timed_out.set()
            await others_ran.wait()
            raise
        raise AssertionError("a question that never ends ended")

    monkeypatch.setattr(SyntheticWrite, "applied", hangs_the_first_time)
    try:
        w = await interrupted_write(client, db)
        await asyncio.wait_for(timed_out.wait(), 60)
        assert asked == [f"{w}/0"]

        other = await client.create_session()
        plain = [
            (await client.submit(other, f"p{i}", f"hello {i}"))["turn"]["id"] for i in range(3)
        ]
        for tid in plain:
            assert (await client.wait_for_status(tid, {"COMPLETED"}, within=30))["output"]
        # Nothing is asked twice at once, nor settled: the first question is not over yet.
        assert asked == [f"{w}/0"]
        assert [c["state"] for c in (await turn(client, w))["toolCalls"]] == ["OUTCOME_UNKNOWN"]
        others_ran.set()

        # Asked again after its backoff, the store answers: the call it never
        # applied is settled as not applied, once.
        t = await settled(client, w, within=60)
        assert asked == [f"{w}/0", f"{w}/0"]
        assert [c["state"] for c in t["toolCalls"]] == ["RECONCILED_NOT_APPLIED"]
        reconciled = [e for e in t["events"] if e["type"] == "tool.reconciled"]
        assert len(reconciled) == 1 and reconciled[0]["data"]["applied"] is False
    finally:
        others_ran.set()
        await client.close()


async def test_a_stop_that_arrives_as_the_worker_is_woken_still_stops_it(
    database_url: str,
) -> None:
    """The claim loop waits to be woken or for its poll interval. A cancel
    that lands in the same moment as a wake-up (a turn ending as the process
    stops) must end the loop: Python 3.11's ``asyncio.wait_for`` returned
    the wake-up instead and swallowed the cancel, and the loop ran on."""
    engine = create_engine(database_url, pool_size=2)
    worker = Worker(
        engine=engine,
        model=FixtureModel(),
        bus=EventBus(engine, poll_s=1),
        # A long poll: after its first claim the loop sits in its wait.
        settings=WorkerSettings(
            max_running=1, lease_ttl_s=5, lease_renew_s=1, claim_poll_s=30, shutdown_grace_s=1
        ),
        owner="w",
    )
    task = asyncio.create_task(worker.run())
    try:
        for _ in range(3):
            await asyncio.sleep(0.5)  # past the first sweep and claim, into the wait
            worker._wake.set()  # the wake-up and the cancel in one step of the loop
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=5)
            assert task in done and task.cancelled(), "the claim loop ran on after its cancel"
            task = asyncio.create_task(worker.run())
    finally:
        task.cancel()
        await asyncio.wait([task], timeout=5)
        await worker.stop()
        await engine.dispose()
