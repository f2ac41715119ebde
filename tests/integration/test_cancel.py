"""cancelTurn against a real server and PostgreSQL: a queued turn ends at once,
a running one stops at a safe point with its output so far, and the key
makes it idempotent like every decision."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process
from tests.support.tool_servers import stdio_entry, write_tools_file

CANCEL = """
mutation($input: CancelTurnInput!) {
  cancelTurn(input: $input) {
    __typename
    ... on TurnCancellation { replayed turn { id status output cancelRequested cancelReason } }
    ... on UserError { code message }
    ... on IdempotencyConflict { idempotencyKey existingTurnId }
    ... on TurnNotCancellable { turnId status }
    ... on TurnAlreadyCancelled { turnId turn { status } }
    ... on TurnNotFound { turnId }
    ... on InvalidInput { field }
  }
}
"""

TURN = """
query($id: ID!) { turn(id: $id) {
  id status output error cancelRequested cancelReason
  events { seq type data }
  toolCalls { index tool state result }
} }
"""


async def cancel(
    client: GraphQLClient, turn_id: str, key: str, reason: str | None = None
) -> dict[str, Any]:
    payload: dict[str, Any] = {"turnId": turn_id, "idempotencyKey": key}
    if reason is not None:
        payload["reason"] = reason
    data = await client.execute(CANCEL, {"input": payload})
    result: dict[str, Any] = data["cancelTurn"]
    return result


async def turn(client: GraphQLClient, turn_id: str) -> dict[str, Any]:
    data = await client.execute(TURN, {"id": turn_id})
    found: dict[str, Any] = data["turn"]
    return found


async def ended(client: GraphQLClient, turn_id: str, within: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        t = await turn(client, turn_id)
        if t["status"] in {"COMPLETED", "FAILED", "INTERRUPTED", "CANCELLED"}:
            return t
        assert time.monotonic() < deadline, t
        await asyncio.sleep(0.05)


async def until(client: GraphQLClient, turn_id: str, event_type: str, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while event_type not in [e["type"] for e in (await turn(client, turn_id))["events"]]:
        assert time.monotonic() < deadline, event_type
        await asyncio.sleep(0.02)


def deltas_of(t: dict[str, Any]) -> str:
    return "".join(e["data"]["text"] for e in t["events"] if e["type"] == "turn.delta")


@pytest.fixture
async def streaming(database_url: str) -> AsyncIterator[InProcessServer]:
    async with serve_in_process(database_url, fast_settings(delta_flush_ms=20)) as srv:
        yield srv


@pytest.fixture
async def sclient(streaming: InProcessServer) -> AsyncIterator[GraphQLClient]:
    c = GraphQLClient(streaming.url)
    yield c
    await c.close()


async def test_a_queued_turn_is_cancelled_at_once_and_the_next_turn_runs(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    first = (await client.submit(sid, "a", "/sleep 1500"))["turn"]["id"]
    second = (await client.submit(sid, "b", "second"))["turn"]["id"]
    third = (await client.submit(sid, "c", "third"))["turn"]["id"]
    answer = await cancel(client, second, "cancel-b", reason="changed my mind")
    assert answer["__typename"] == "TurnCancellation", answer
    assert answer["replayed"] is False
    assert answer["turn"]["status"] == "CANCELLED"
    assert answer["turn"]["cancelReason"] == "changed my mind"
    t = await turn(client, second)
    assert [e["type"] for e in t["events"]] == ["turn.started", "turn.cancelled"]
    assert t["events"][-1]["data"]["reason"] == "changed my mind"
    assert t["events"][-1]["data"]["was"] == "QUEUED"
    done = await ended(client, third)
    assert done["status"] == "COMPLETED"
    assert (await ended(client, first))["status"] == "COMPLETED"
    # The cancelled turn never ran: no claim, no epoch.
    row = await db.fetchrow("SELECT epoch, owner FROM turns WHERE id = $1::uuid", second)
    assert (row["epoch"], row["owner"]) == (0, None)


async def test_cancelling_the_only_queued_turn_of_a_session_lets_the_next_one_run_at_once(
    client: GraphQLClient,
) -> None:
    sid = await client.create_session()
    # Long enough that a loaded machine still cancels it before it ends;
    # the second too: once the first is cancelled, the second may be claimed
    # before its own cancel arrives, and must still be running then.
    running = (await client.submit(sid, "a", "/sleep 4000"))["turn"]["id"]
    queued = (await client.submit(sid, "b", "/sleep 4000"))["turn"]["id"]
    await cancel(client, running, "stop-a")
    await cancel(client, queued, "stop-b")
    after = (await client.submit(sid, "c", "after"))["turn"]["id"]
    assert (await ended(client, after))["status"] == "COMPLETED"
    assert (await ended(client, running))["status"] == "CANCELLED"
    assert (await turn(client, queued))["status"] == "CANCELLED"


async def test_a_running_stream_stops_and_its_output_is_the_concatenation_of_its_deltas(
    sclient: GraphQLClient,
) -> None:
    sid = await sclient.create_session()
    tid = (await sclient.submit(sid, "s", "/stream 20 200"))["turn"]["id"]
    deadline = time.monotonic() + 10
    while len([e for e in (await turn(sclient, tid))["events"] if e["type"] == "turn.delta"]) < 3:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    answer = await cancel(sclient, tid, "stop", reason="enough")
    assert answer["__typename"] == "TurnCancellation", answer
    assert answer["turn"]["status"] == "RUNNING"
    assert answer["turn"]["cancelRequested"] is True
    t = await ended(sclient, tid)
    assert t["status"] == "CANCELLED"
    types = [e["type"] for e in t["events"]]
    assert types.count("turn.cancel_requested") == 1
    assert types[-1] == "turn.cancelled"
    assert "turn.completed" not in types
    # Deltas stopped: fewer than the 20 pieces, and nothing after the end.
    assert types.index("turn.cancel_requested") < types.index("turn.cancelled")
    output = t["output"]
    assert output and output == deltas_of(t)
    assert t["events"][-1]["data"]["output"] == output
    assert t["events"][-1]["data"]["reason"] == "enough"
    full = "".join(e["data"]["text"] for e in t["events"] if e["type"] == "turn.delta")
    assert len(full) == len(output)
    # The stream had 20 pieces 200 ms apart; it was cut well before the end.
    assert types.count("turn.delta") < 20


async def test_the_answer_is_idempotent_under_its_key(client: GraphQLClient, db: Any) -> None:
    sid = await client.create_session()
    running = (await client.submit(sid, "a", "/sleep 1500"))["turn"]["id"]
    queued = (await client.submit(sid, "b", "queued"))["turn"]["id"]
    # From here the running turn writes nothing until it ends.
    await client.wait_for_status(running, {"RUNNING"})
    first = await cancel(client, queued, "k", reason="why")
    events = await db.fetchval("SELECT count(*) FROM events WHERE session_id = $1::uuid", sid)
    again = await cancel(client, queued, "k", reason="why")
    assert again["__typename"] == "TurnCancellation"
    assert again["replayed"] is True
    assert again["turn"]["id"] == first["turn"]["id"]
    assert again["turn"]["status"] == "CANCELLED"
    # A different reason, or a different turn, under the same key: a conflict.
    other_reason = await cancel(client, queued, "k", reason="another")
    assert other_reason["__typename"] == "IdempotencyConflict"
    assert other_reason["existingTurnId"] == queued
    other_turn = await cancel(client, running, "k", reason="why")
    assert other_turn["__typename"] == "IdempotencyConflict"
    assert other_turn["existingTurnId"] == queued
    # No reason is another request than a reason.
    no_reason = await cancel(client, queued, "k")
    assert no_reason["__typename"] == "IdempotencyConflict"
    after = await db.fetchval("SELECT count(*) FROM events WHERE session_id = $1::uuid", sid)
    assert after == events
    # The running turn is untouched by the conflicting requests.
    assert (await ended(client, running))["status"] == "COMPLETED"


async def test_keys_of_cancels_and_of_turns_share_one_namespace(client: GraphQLClient) -> None:
    sid = await client.create_session()
    first = (await client.submit(sid, "turn-key", "/sleep 800"))["turn"]["id"]
    queued = (await client.submit(sid, "other", "queued"))["turn"]["id"]
    # A turn's key takes no cancel.
    taken = await cancel(client, queued, "turn-key")
    assert taken["__typename"] == "IdempotencyConflict"
    assert taken["existingTurnId"] == first
    assert (await turn(client, queued))["status"] == "QUEUED"
    # A cancel's key admits no turn.
    await cancel(client, queued, "cancel-key")
    submitted = await client.submit(sid, "cancel-key", "hello")
    assert submitted["__typename"] == "IdempotencyConflict"
    assert submitted["existingTurnId"] == queued


async def _waiting_for_locks(db: Any, count: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # Backends of this database waiting for a lock: the first to wait
        # for a row waits on its holder's transaction id, a lock of no
        # database in pg_locks, so counting those missed it. This runs in
        # the transaction holding the lock, where pg_stat_activity keeps
        # what it showed first unless the snapshot is cleared.
        await db.execute("SELECT pg_stat_clear_snapshot()")
        waiting = await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        if waiting >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"fewer than {count} requests waited for the session's lock")


async def test_a_submission_that_waited_behind_a_cancel_for_its_new_key_takes_nothing(
    client: GraphQLClient, db: Any
) -> None:
    """The moment a shared namespace could split: a submission found the key
    free, then waited for the session's lock while a cancel under the same
    key held it and committed. The submission's key is judged against what
    is committed when its turn would go in, so it answers IdempotencyConflict
    and writes nothing, rather than recording a turn beside the cancel."""
    sid = await client.create_session()
    # Running until well after the cancel: a queued turn that ended before
    # it would answer the cancel without waiting for the lock.
    blocker = (await client.submit(sid, "blocker", "/sleep 15000"))["turn"]["id"]
    queued = (await client.submit(sid, "queued", "queued"))["turn"]["id"]
    holding = db.transaction()
    await holding.start()
    try:
        await db.execute("SELECT 1 FROM sessions WHERE id = $1::uuid FOR UPDATE", sid)
        # The cancel queues first for the lock, then the submission, which
        # has already found the key free.
        cancelling = asyncio.create_task(cancel(client, queued, "shared"))
        await _waiting_for_locks(db, 1)
        submitting = asyncio.create_task(client.submit(sid, "shared", "hello"))
        await _waiting_for_locks(db, 2)
    finally:
        await holding.commit()
    cancelled, submitted = await cancelling, await submitting
    assert cancelled["__typename"] == "TurnCancellation", cancelled
    assert submitted["__typename"] == "IdempotencyConflict", submitted
    assert submitted["existingTurnId"] == queued
    assert (
        await db.fetchval(
            "SELECT count(*) FROM turns WHERE session_id = $1::uuid AND idempotency_key = 'shared'",
            sid,
        )
        == 0
    )
    # One event under the key: the cancel's.
    under_key = await db.fetch(
        "SELECT type FROM events WHERE session_id = $1::uuid"
        " AND data ->> 'idempotencyKey' = 'shared'",
        sid,
    )
    assert [r["type"] for r in under_key] == ["turn.cancelled"]
    await cancel(client, blocker, "stop-blocker")


async def test_an_ended_turn_is_not_cancellable_and_a_cancelled_one_is_already_cancelled(
    client: GraphQLClient,
) -> None:
    sid = await client.create_session()
    done = (await client.submit(sid, "a", "done"))["turn"]["id"]
    await ended(client, done)
    answer = await cancel(client, done, "k1")
    assert answer["__typename"] == "TurnNotCancellable"
    assert answer["code"] == "TURN_NOT_CANCELLABLE"
    assert answer["status"] == "COMPLETED"
    blocker = (await client.submit(sid, "b", "/sleep 800"))["turn"]["id"]
    queued = (await client.submit(sid, "c", "queued"))["turn"]["id"]
    await cancel(client, queued, "k2")
    again = await cancel(client, queued, "k3")
    assert again["__typename"] == "TurnAlreadyCancelled"
    assert again["code"] == "TURN_ALREADY_CANCELLED"
    assert again["turn"]["status"] == "CANCELLED"
    await ended(client, blocker)


async def test_an_unknown_turn_or_a_bad_request_writes_nothing(
    client: GraphQLClient, db: Any
) -> None:
    unknown = await cancel(client, str(uuid.uuid4()), "k")
    assert unknown["__typename"] == "TurnNotFound"
    bad_id = await cancel(client, "not-a-uuid", "k")
    assert (bad_id["__typename"], bad_id["field"]) == ("InvalidInput", "turnId")
    sid = await client.create_session()
    tid = (await client.submit(sid, "a", "/sleep 300"))["turn"]["id"]
    empty_key = await cancel(client, tid, "")
    assert (empty_key["__typename"], empty_key["field"]) == ("InvalidInput", "idempotencyKey")
    long_reason = await cancel(client, tid, "k", reason="x" * 1001)
    assert (long_reason["__typename"], long_reason["field"]) == ("InvalidInput", "reason")
    t = await ended(client, tid)
    assert t["status"] == "COMPLETED"
    assert t["cancelRequested"] is False


@pytest.fixture
async def tools_server(database_url: str, tmp_path: Path) -> AsyncIterator[InProcessServer]:
    tools = write_tools_file(tmp_path / "tools.toml", stdio_entry(tmp_path / "effects.jsonl"))
    async with serve_in_process(database_url, fast_settings(tools_file=tools)) as srv:
        yield srv


async def test_a_tool_in_flight_finishes_and_the_cancel_stops_the_turn_before_the_next_intent(
    tools_server: InProcessServer,
) -> None:
    client = GraphQLClient(tools_server.url)
    try:
        sid = await client.create_session()
        tid = (
            await client.submit(
                sid,
                "t",
                '/call files__slow_lookup {"seconds": 1.5}\n/write after=1',
            )
        )["turn"]["id"]
        await until(client, tid, "tool.intent")
        answer = await cancel(client, tid, "stop", reason="mid-tool")
        assert answer["turn"]["status"] == "RUNNING"
        t = await ended(client, tid)
        assert t["status"] == "CANCELLED"
        types = [e["type"] for e in t["events"]]
        # The slow call finished (its result is recorded, after the request);
        # the second call never got an intent.
        assert types.count("tool.intent") == 1
        assert types.count("tool.result") == 1
        assert types.index("turn.cancel_requested") < types.index("tool.result")
        states = {c["index"]: c["state"] for c in t["toolCalls"]}
        assert states == {0: "COMPLETED", 1: "NOT_STARTED"}
        end = t["events"][-1]["data"]
        assert end["inFlightCall"] == 0
        assert [(c["index"], c["state"]) for c in end["toolCalls"]] == [
            (0, "COMPLETED"),
            (1, "NOT_STARTED"),
        ]
        assert end["toolCalls"][0]["result"] is not None
    finally:
        await client.close()


async def test_a_cancel_racing_completion_ends_each_turn_exactly_once(
    client: GraphQLClient,
) -> None:
    sid = await client.create_session()
    rng = random.Random(7)
    turns = [
        (await client.submit(sid, f"k{n}", f"/stream 3 {rng.randint(20, 60)}"))["turn"]["id"]
        for n in range(12)
    ]
    for n, tid in enumerate(turns):
        deadline = time.monotonic() + 20
        while (await turn(client, tid))["status"] == "QUEUED":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        await asyncio.sleep(rng.uniform(0, 0.15))
        answer = await cancel(client, tid, f"c{n}")
        assert answer["__typename"] in {"TurnCancellation", "TurnNotCancellable"}, answer
    outcomes = []
    for tid in turns:
        t = await ended(client, tid)
        types = [e["type"] for e in t["events"]]
        ends = [x for x in types if x in {"turn.completed", "turn.cancelled", "turn.failed"}]
        assert len(ends) == 1, types
        assert (
            t["status"] == {"turn.completed": "COMPLETED", "turn.cancelled": "CANCELLED"}[ends[0]]
        )
        assert (t["output"] or "") == deltas_of(t)
        outcomes.append(t["status"])
    assert set(outcomes) <= {"COMPLETED", "CANCELLED"}


@pytest.fixture
async def approving(database_url: str) -> AsyncIterator[InProcessServer]:
    async with serve_in_process(database_url, fast_settings(approve_unsafe=True)) as srv:
        yield srv


async def test_a_turn_waiting_for_approval_is_cancelled_at_once_and_its_call_never_runs(
    approving: InProcessServer, db: Any
) -> None:
    client = GraphQLClient(approving.url)
    try:
        sid = await client.create_session()
        tid = (await client.submit(sid, "w", "/append a=1"))["turn"]["id"]
        after = (await client.submit(sid, "n", "next"))["turn"]["id"]
        await client.wait_for_status(tid, {"WAITING"})
        answer = await cancel(client, tid, "stop")
        assert answer["__typename"] == "TurnCancellation", answer
        assert answer["turn"]["status"] == "CANCELLED"
        t = await turn(client, tid)
        assert t["events"][-1]["type"] == "turn.cancelled"
        assert t["events"][-1]["data"]["was"] == "WAITING"
        assert "tool.intent" not in [e["type"] for e in t["events"]]
        # The queue behind it moves on.
        assert (await ended(client, after))["status"] == "COMPLETED"
        decided = await client.execute(
            """mutation($i: DecideToolCallInput!) { decideToolCall(input: $i) { __typename } }""",
            {"i": {"turnId": tid, "index": 0, "decision": "APPROVE", "idempotencyKey": "d"}},
        )
        assert decided["decideToolCall"]["__typename"] == "ToolCallNotAwaitingApproval"
        assert await db.fetchval("SELECT count(*) FROM synthetic_effects") == 0
    finally:
        await client.close()


async def test_a_turn_that_went_on_to_wait_after_its_cancel_was_asked_ends_on_the_next_cancel(
    approving: InProcessServer, db: Any
) -> None:
    client = GraphQLClient(approving.url)
    try:
        sid = await client.create_session()
        tid = (await client.submit(sid, "w", "/append a=1"))["turn"]["id"]
        after = (await client.submit(sid, "n", "next"))["turn"]["id"]
        await client.wait_for_status(tid, {"WAITING"})
        # The record as a request and a wait that crossed leave it: the
        # request was recorded while it ran, then it stopped to wait.
        await db.execute(
            "UPDATE turns SET cancel_requested_at = now(), cancel_key = 'first', "
            "cancel_fingerprint = 'f', cancel_reason = 'crossed' WHERE id = $1::uuid",
            tid,
        )
        answer = await cancel(client, tid, "second")
        assert answer["__typename"] == "TurnAlreadyCancelled", answer
        assert answer["turn"]["status"] == "CANCELLED"
        t = await turn(client, tid)
        assert t["events"][-1]["type"] == "turn.cancelled"
        assert t["events"][-1]["data"]["reason"] == "crossed"
        assert (await ended(client, after))["status"] == "COMPLETED"
    finally:
        await client.close()
