"""Streamed output: turn.delta events while the model streams, Turn.output
while it runs, and the turnEvents subscription, against a real server."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
from gql.transport.exceptions import TransportQueryError

from keyturn.db import deltas, leases
from keyturn.db.engine import Engine, connect, create_engine
from keyturn.db.ledger import Appended
from keyturn.domain import History
from keyturn.errors import ModelError, StaleLease
from keyturn.runtime.admission import AdmissionOutcome, admit_turn
from keyturn.runtime.bus import EventBus
from keyturn.runtime.model import Emit, PastTurn, Round, ToolRequest, ToolSpec
from keyturn.runtime.output import Delta, DeltaRecorder
from keyturn.runtime.validation import TurnRequest
from keyturn.runtime.worker import Worker, WorkerSettings
from tests.integration.test_cancel import cancel
from tests.integration.test_tool_ledger import take_over
from tests.support import (
    GraphQLClient,
    InProcessServer,
    fast_settings,
    request,
    serve_in_process,
    ws_session,
)
from tests.support.statements import counting_statements

TURN_EVENTS = (
    "subscription($t: ID!, $a: Int) { turnEvents(turnId: $t, afterSeq: $a) "
    "{ seq type turnId data } }"
)


@pytest.fixture
async def streaming(database_url: str) -> AsyncIterator[InProcessServer]:
    """A server that records a delta as soon as 20 ms have passed: with the
    fixture's pauses of 300 ms and more, each piece is a delta of its own."""
    async with serve_in_process(database_url, fast_settings(delta_flush_ms=20)) as srv:
        yield srv


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[Engine]:
    e = create_engine(database_url, pool_size=4)
    yield e
    await e.dispose()


async def record(db: Any, turn_id: str) -> list[dict[str, Any]]:
    """The turn's events straight from the table, oldest first."""
    rows = await db.fetch(
        "SELECT seq, type, data, created_at FROM events WHERE turn_id = $1::uuid ORDER BY seq",
        turn_id,
    )
    return [{**row, "data": json.loads(row["data"])} for row in rows]


def texts(events: Sequence[Any]) -> list[str]:
    return [e["data"]["text"] for e in events if e["type"] == "turn.delta"]


async def test_a_streamed_turn_records_each_piece_and_its_output_grows_while_it_runs(
    streaming: InProcessServer, db: Any
) -> None:
    client = GraphQLClient(streaming.url)
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "/stream 5 400 tell me slowly"))["turn"]
    seen: list[str] = []  # Turn.output each time it was read while RUNNING
    while True:
        now = await client.turn(turn["id"])
        assert now is not None
        if now["status"] != "RUNNING" and now["status"] != "QUEUED":
            break
        if now["status"] == "RUNNING" and now["output"] and now["output"] not in seen:
            seen.append(now["output"])
        await asyncio.sleep(0.05)
    assert now["status"] == "COMPLETED"
    final = now["output"]
    assert final.startswith("fixture reply to: /stream 5 400 tell me slowly")

    events = await record(db, turn["id"])
    assert [e["type"] for e in events] == [
        "turn.started",
        "turn.running",
        *["turn.delta"] * 5,
        "turn.completed",
    ]
    assert [e["seq"] for e in events] == list(range(1, 9))
    pieces = [e["data"] for e in events if e["type"] == "turn.delta"]
    assert [p["index"] for p in pieces] == [0, 1, 2, 3, 4]
    assert {p["epoch"] for p in pieces} == {now["epoch"]}
    assert "".join(p["text"] for p in pieces) == final
    # Read while it ran: what was recorded so far, growing, never the whole.
    assert len(seen) >= 2
    assert all(final.startswith(s) and len(s) < len(final) for s in seen)
    assert [len(s) for s in seen] == sorted({len(s) for s in seen})
    await client.close()


async def test_deltas_are_coalesced_to_at_most_one_per_flush_interval(
    database_url: str, db: Any
) -> None:
    async with serve_in_process(database_url, fast_settings(delta_flush_ms=150)) as srv:
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        turn = (await client.submit(sid, "k", "/stream 12 30"))["turn"]
        done = await client.wait_for_status(turn["id"], {"COMPLETED"})
        await client.close()
    events = await record(db, turn["id"])
    pieces = [e for e in events if e["type"] == "turn.delta"]
    assert "".join(texts(events)) == done["output"]
    assert 1 <= len(pieces) < 12
    # Every delta but the last (written with the end) waited a whole interval
    # after the one before it.
    interval = datetime.timedelta(milliseconds=150)
    for before, after in itertools.pairwise(pieces[:-1]):
        assert after["created_at"] - before["created_at"] >= interval
    assert pieces[-1]["created_at"] == events[-1]["created_at"]  # one statement


async def test_a_stream_shorter_than_the_interval_is_one_delta_written_with_the_end(
    database_url: str, db: Any
) -> None:
    async with serve_in_process(database_url, fast_settings(delta_flush_ms=5000)) as srv:
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        turn = (await client.submit(sid, "k", "/stream 6 20"))["turn"]
        done = await client.wait_for_status(turn["id"], {"COMPLETED"})
        await client.close()
    events = await record(db, turn["id"])
    assert [e["type"] for e in events][-2:] == ["turn.delta", "turn.completed"]
    assert texts(events) == [done["output"]]


async def test_a_reply_in_one_piece_costs_one_event_and_no_commit_more(
    database_url: str, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with counting_statements(monkeypatch) as seen:
        async with serve_in_process(database_url) as srv:
            client = GraphQLClient(srv.url)
            sid = await client.create_session()
            turn = (await client.submit(sid, "k", "hello"))["turn"]
            done = await client.wait_for_status(turn["id"], {"COMPLETED"})
            await client.close()
    events = await record(db, turn["id"])
    assert [e["type"] for e in events] == [
        "turn.started",
        "turn.running",
        "turn.delta",
        "turn.completed",
    ]
    assert texts(events) == [done["output"]]
    assert events[2]["data"] == {"text": done["output"], "index": 0, "epoch": 1}
    # The delta came with the finish: no statement of its own.
    assert str(deltas._APPEND) not in seen
    assert seen.count(str(leases._FINISH)) == 1
    assert events[2]["created_at"] == events[3]["created_at"]


async def test_a_failed_turn_keeps_what_it_streamed(engine: Engine, db: Any) -> None:
    class HalfThenFail:
        async def step(
            self,
            *,
            input: str,
            mode: History,
            history: Sequence[PastTurn],
            rounds: Sequence[Round],
            tools: Sequence[ToolSpec],
            emit: Emit,
        ) -> list[ToolRequest]:
            await emit("the first half, ")
            await asyncio.sleep(0.3)
            await emit("then ")
            raise ModelError("the model gave up")

    sid = uuid.uuid4()
    await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'FULL')", sid)
    admission = await admit_turn(
        engine=engine, request=TurnRequest(sid, "k", "hello", History.FULL)
    )
    assert admission.outcome is AdmissionOutcome.ACCEPTED and admission.turn is not None
    bus = EventBus(engine, poll_s=1)
    worker = Worker(
        engine=engine,
        model=HalfThenFail(),
        bus=bus,
        settings=WorkerSettings(
            max_running=1,
            lease_ttl_s=5,
            lease_renew_s=1,
            claim_poll_s=0.1,
            shutdown_grace_s=1,
            delta_flush_s=0.05,
        ),
        owner="w",
    )
    task = asyncio.create_task(worker.run())
    try:
        for _ in range(200):
            status = await db.fetchval("SELECT status FROM turns WHERE id = $1", admission.turn.id)
            if status not in ("QUEUED", "RUNNING"):
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await worker.stop()
    row = await db.fetchrow(
        "SELECT status, output, error FROM turns WHERE id = $1", admission.turn.id
    )
    assert (row["status"], row["error"]) == ("FAILED", "the model gave up")
    events = await record(db, str(admission.turn.id))
    assert [e["type"] for e in events] == [
        "turn.started",
        "turn.running",
        "turn.delta",
        "turn.delta",
        "turn.failed",
    ]
    assert texts(events) == ["the first half, ", "then "]
    assert row["output"] == "the first half, then "


async def test_a_stale_epochs_delta_is_refused_and_recorded(engine: Engine, db: Any) -> None:
    sid = uuid.uuid4()
    await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'FULL')", sid)
    await admit_turn(engine=engine, request=TurnRequest(sid, "k", "hello", History.FULL))
    async with connect(engine) as conn:
        [claimed] = (await leases.claim(conn, owner="old", ttl_s=30, limit=1)).turns
    recorder = DeltaRecorder(
        engine=engine, bus=EventBus(engine, poll_s=1), turn=claimed, owner="old", lease_ttl_s=3
    )
    await recorder(Delta(0, "early "))
    # A retried append of the same piece (its answer lost) appends nothing.
    async with connect(engine) as conn:
        again = await deltas.append(
            conn, turn_id=claimed.id, epoch=claimed.epoch, index=0, text="early "
        )
    assert again is Appended.DUPLICATE
    # The lease runs out; a live process interrupts the turn; the old owner
    # wakes and streams on.
    await db.execute("UPDATE turns SET lease_until = now() - interval '1 second'")
    async with connect(engine) as conn:
        [_interrupted] = await leases.interrupt_expired(conn, by="sweeper")
    with pytest.raises(StaleLease):
        await recorder(Delta(1, "late"))
    events = await record(db, str(claimed.id))
    assert [e["type"] for e in events] == [
        "turn.started",
        "turn.running",
        "turn.delta",
        "turn.interrupted",
        "turn.write_refused",
    ]
    assert events[3]["data"]["outputChars"] == len("early ")
    refused = events[4]["data"]
    assert (refused["attempted"], refused["staleEpoch"], refused["by"]) == (
        "turn.delta",
        claimed.epoch,
        "old",
    )
    row = await db.fetchrow("SELECT status, output FROM turns WHERE id = $1", claimed.id)
    assert (row["status"], row["output"]) == ("INTERRUPTED", "early ")


async def test_turn_events_from_the_start_and_resumed_mid_stream(
    streaming: InProcessServer, db: Any
) -> None:
    client = GraphQLClient(streaming.url)
    sid = await client.create_session()
    # An earlier turn, whose events the stream of the next one must not carry.
    first = (await client.submit(sid, "a", "before"))["turn"]
    await client.wait_for_status(first["id"], {"COMPLETED"})
    turn = (await client.submit(sid, "b", "/stream 6 300"))["turn"]
    async with ws_session(streaming.ws_url) as ws_a, ws_session(streaming.ws_url) as ws_b:
        whole: list[Any] = []
        resumed: list[Any] = []
        resume_at: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def from_start() -> None:
            async for r in ws_a.subscribe(request(TURN_EVENTS, t=turn["id"], a=0)):
                whole.append(r["turnEvents"])
                if sum(e["type"] == "turn.delta" for e in whole) == 2 and not resume_at.done():
                    resume_at.set_result(r["turnEvents"]["seq"])

        async def from_middle() -> None:
            after = await resume_at
            async for r in ws_b.subscribe(request(TURN_EVENTS, t=turn["id"], a=after)):
                resumed.append(r["turnEvents"])

        # Each stream ends by itself after the terminal event.
        await asyncio.wait_for(asyncio.gather(from_start(), from_middle()), 30)
    events = await record(db, turn["id"])
    assert [(e["seq"], e["type"]) for e in whole] == [(e["seq"], e["type"]) for e in events]
    assert whole[-1]["type"] == "turn.completed"
    assert {e["turnId"] for e in whole} == {turn["id"]}
    after = resume_at.result()
    assert resumed == [e for e in whole if e["seq"] > after]
    assert resumed and resumed[0]["type"] == "turn.delta"
    done = await client.turn(turn["id"])
    assert done is not None
    assert "".join(e["data"]["text"] for e in whole if e["type"] == "turn.delta") == done["output"]

    # An ended turn: from the record at once; nothing after its end.
    async with ws_session(streaming.ws_url) as ws:
        again = [r["turnEvents"] async for r in ws.subscribe(request(TURN_EVENTS, t=turn["id"]))]
        done_seq = whole[-1]["seq"]
        past_end = [r async for r in ws.subscribe(request(TURN_EVENTS, t=turn["id"], a=done_seq))]
    assert again == whole
    assert past_end == []
    await client.close()


async def test_session_events_carry_the_deltas_too(streaming: InProcessServer) -> None:
    client = GraphQLClient(streaming.url)
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "/stream 3 300"))["turn"]
    got: list[Any] = []
    async with ws_session(streaming.ws_url) as ws:

        async def until_done() -> None:
            subscription = (
                "subscription($s: ID!) { sessionEvents(sessionId: $s) { seq type data } }"
            )
            async for r in ws.subscribe(request(subscription, s=sid)):
                got.append(r["sessionEvents"])
                if r["sessionEvents"]["type"] == "turn.completed":
                    return

        await asyncio.wait_for(until_done(), 30)
    assert [e["type"] for e in got] == [
        "turn.started",
        "turn.running",
        "turn.delta",
        "turn.delta",
        "turn.delta",
        "turn.completed",
    ]
    done = await client.turn(turn["id"])
    assert done is not None
    assert "".join(e["data"]["text"] for e in got[2:5]) == done["output"]
    await client.close()


@pytest.mark.parametrize("turn_id", ["00000000-0000-4000-8000-000000000000", "not-an-id"])
async def test_turn_events_of_an_unknown_turn_is_not_found(
    server: InProcessServer, turn_id: str
) -> None:
    async with ws_session(server.ws_url) as ws:
        with pytest.raises(TransportQueryError) as caught:
            async with asyncio.timeout(10):
                async for _ in ws.subscribe(request(TURN_EVENTS, t=turn_id)):
                    pass
    assert "not found" in str(caught.value)
    assert caught.value.errors is not None
    assert caught.value.errors[0]["extensions"]["code"] == "NOT_FOUND"


async def test_turn_events_refuses_a_negative_after_seq(
    server: InProcessServer, client: GraphQLClient
) -> None:
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "hello"))["turn"]
    async with ws_session(server.ws_url) as ws:
        with pytest.raises(TransportQueryError) as caught:
            async with asyncio.timeout(10):
                async for _ in ws.subscribe(request(TURN_EVENTS, t=turn["id"], a=-1)):
                    pass
    assert "afterSeq must not be negative" in str(caught.value)


async def stop_by_cancelling(client: GraphQLClient, db: Any, turn_id: str) -> None:
    answer = await cancel(client, turn_id, "stop", reason="enough")
    assert answer["__typename"] == "TurnCancellation", answer


async def stop_by_taking_over(client: GraphQLClient, db: Any, turn_id: str) -> None:
    # Its process's renewal is refused from now on and its lease is past: the
    # sweep interrupts it.
    await take_over(db, turn_id)


@pytest.mark.parametrize(
    ("stop", "terminal"),
    [(stop_by_cancelling, "turn.cancelled"), (stop_by_taking_over, "turn.interrupted")],
    ids=["cancelled", "interrupted"],
)
async def test_turn_events_ends_after_a_turn_stopped_mid_stream(
    streaming: InProcessServer,
    db: Any,
    stop: Callable[[GraphQLClient, Any, str], Awaitable[None]],
    terminal: str,
) -> None:
    client = GraphQLClient(streaming.url)
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "/stream 20 200"))["turn"]
    got: list[Any] = []
    streaming_now = asyncio.Event()

    async def listen() -> None:
        async with ws_session(streaming.ws_url) as ws:
            async for r in ws.subscribe(request(TURN_EVENTS, t=turn["id"], a=0)):
                got.append(r["turnEvents"])
                if sum(e["type"] == "turn.delta" for e in got) == 3:
                    streaming_now.set()

    listening = asyncio.create_task(listen())
    try:
        await asyncio.wait_for(streaming_now.wait(), 30)
        await stop(client, db, turn["id"])
        # The stream ends by itself; a hang fails here, not the whole run.
        await asyncio.wait_for(listening, 30)
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        await client.close()
    events = await record(db, turn["id"])
    [end] = [n for n, e in enumerate(events) if e["type"] == terminal]
    # What the record holds up to the end, each event once and in order
    # (anything recorded after it, such as a late write refused, is not
    # part of the stream).
    assert [(e["seq"], e["type"], e["data"]) for e in got] == [
        (e["seq"], e["type"], e["data"]) for e in events[: end + 1]
    ]
    assert [e["seq"] for e in got] == sorted({e["seq"] for e in got})
    assert got[-1]["type"] == terminal
    assert {e["turnId"] for e in got} == {turn["id"]}
    # Stopped mid-stream: some of the twenty pieces were recorded, not all.
    assert 3 <= len(texts(got)) < 20
