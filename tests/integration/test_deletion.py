"""deleteSession against a real server and PostgreSQL: idempotent under its
key, cancelling a running turn first (and answering SessionBusy, the cancel
recorded, when it cannot stop in time), and afterwards the session answers
everywhere as one that never existed (its deletion key excepted); live
subscribers are told, and admissions and turn ends racing the deletion
leave nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from gql.transport.exceptions import TransportQueryError

from keyturn.runtime.auth import create_token
from tests.support import (
    SESSION_EVENTS,
    TURN_COMPLETED,
    GraphQLClient,
    InProcessServer,
    fast_settings,
    request,
    serve_in_process,
    ws_session,
)
from tests.support.recorded import (
    CANCEL,
    DECIDE,
    RESOLVE,
    record_session,
    recording_settings,
    rows_of_session,
)

DELETE = """
mutation($i: DeleteSessionInput!) { deleteSession(input: $i) {
  __typename
  ... on SessionDeleted { sessionId replayed }
  ... on UserError { code message }
  ... on SessionBusy { sessionId turnId }
  ... on DeletionKeyConflict { idempotencyKey existingSessionId }
  ... on SessionNotFound { sessionId }
  ... on InvalidInput { field }
} }
"""

TURN_EVENTS = (
    "subscription($t: ID!, $a: Int) { turnEvents(turnId: $t, afterSeq: $a) "
    "{ seq type turnId data } }"
)

READS = """
query($s: ID!, $t: ID!, $e: ID!) {
  session(id: $s) { id }
  turn(id: $t) { id }
  sessionNode: node(id: $s) { id }
  turnNode: node(id: $t) { id }
  eventNode: node(id: $e) { id }
  nodes(ids: [$s, $t, $e]) { id }
  sessions(first: 100) { totalCount edges { node { id } } }
}
"""


async def delete(client: GraphQLClient, session_id: str, key: str) -> dict[str, Any]:
    data = await client.execute(DELETE, {"i": {"sessionId": session_id, "idempotencyKey": key}})
    result: dict[str, Any] = data["deleteSession"]
    return result


def without(text: str, *ids: str) -> str:
    for value in ids:
        text = text.replace(value, "ID")
    return text


async def whole_answers(
    client: GraphQLClient,
    query: str,
    gone: dict[str, Any],
    never: dict[str, Any],
    ids: tuple[str, str],
) -> tuple[str, str]:
    """The whole answers (data and errors) to ``query`` with the gone
    variables and with the never-existed ones, each id made the same."""
    a = json.dumps(await client.raw(query, gone), sort_keys=True)
    b = json.dumps(await client.raw(query, never), sort_keys=True)
    return without(a, ids[0]), without(b, ids[1])


def only_its_deletion(rows: dict[str, int]) -> dict[str, int]:
    """What rows_of_session finds of a deleted session: its deletion's key."""
    return {t: (1 if t == "session_deletions" else 0) for t in rows}


# Nothing anywhere refers to a session or turn that is not there.
ORPHANS = """SELECT (SELECT count(*) FROM turns t LEFT JOIN sessions s ON s.id = t.session_id
                     WHERE s.id IS NULL)
                  + (SELECT count(*) FROM events e LEFT JOIN turns t ON t.id = e.turn_id
                     WHERE e.turn_id IS NOT NULL AND t.id IS NULL)
                  + (SELECT count(*) FROM events e LEFT JOIN sessions s ON s.id = e.session_id
                     WHERE s.id IS NULL)"""


async def worker_idle(server: InProcessServer) -> None:
    """Until the server runs no turn: whatever a turn's task would still
    write, it has written."""
    worker = server.app.state.runtime.worker
    async with asyncio.timeout(15):
        while worker.running_count:  # noqa: ASYNC110 - a plain attribute of the worker
            await asyncio.sleep(0.02)


def trouble(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Log lines that would say a turn's process met a record that was gone:
    errors, and a write refused or left to a lease."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR
        or "refused" in r.getMessage()
        or "leaving it to its lease" in r.getMessage()
    ]


async def stream_error(ws_url: str, query: str, **variables: Any) -> Any:
    """The error a subscription ends with (and the items it yielded first)."""
    async with ws_session(ws_url) as ws:
        with pytest.raises(TransportQueryError) as caught:
            async with asyncio.timeout(15):
                async for _ in ws.subscribe(request(query, **variables)):
                    pass
    return caught.value.errors[0] if caught.value.errors else None


@pytest.fixture
async def server(database_url: str) -> AsyncIterator[InProcessServer]:
    """This module's default server: leases long enough for a recorded session."""
    async with serve_in_process(database_url, recording_settings()) as srv:
        yield srv


async def test_a_deleted_session_leaves_no_row_and_its_key_replays(
    client: GraphQLClient, db: Any
) -> None:
    recorded = await record_session(client, db)
    sid = recorded.session_id
    before = await rows_of_session(db, sid)
    assert before["turns"] == 4 and before["resolutions"] == 1 and before["events"] > 10
    tool_events = await db.fetchval(
        "SELECT count(*) FROM events WHERE session_id = $1::uuid AND type LIKE 'tool.%'", sid
    )
    assert tool_events > 0

    first = await delete(client, sid, "bye")
    assert first == {"__typename": "SessionDeleted", "sessionId": sid, "replayed": False}
    after = await rows_of_session(db, sid)
    assert after == {t: (1 if t == "session_deletions" else 0) for t in before}

    again = await delete(client, sid, "bye")
    assert again == {"__typename": "SessionDeleted", "sessionId": sid, "replayed": True}
    assert await rows_of_session(db, sid) == after
    # Another key for the gone session: as for a session that never existed.
    other = await delete(client, sid, "bye-again")
    assert other["__typename"] == "SessionNotFound" and other["code"] == "SESSION_NOT_FOUND"
    assert await db.fetchval("SELECT count(*) FROM session_deletions") == 1


async def test_the_same_key_for_another_session_is_a_conflict_and_deletes_nothing(
    client: GraphQLClient, db: Any
) -> None:
    a = await client.create_session()
    b = await client.create_session()
    assert (await delete(client, a, "k"))["__typename"] == "SessionDeleted"
    conflict = await delete(client, b, "k")
    assert conflict["__typename"] == "DeletionKeyConflict"
    assert conflict["code"] == "IDEMPOTENCY_CONFLICT"
    assert conflict["existingSessionId"] == a
    assert conflict["idempotencyKey"] == "k"
    assert await client.session(b) is not None
    assert (await delete(client, b, "k2"))["__typename"] == "SessionDeleted"


async def follow(
    ws: Any,
    req: Any,
    field: str,
    seen: list[dict[str, Any]],
    errors: dict[str, Any],
    name: str,
) -> None:
    """Collect a subscription's ``field`` into ``seen`` until it ends; the
    error it was closed with goes to ``errors[name]``."""
    try:
        async for r in ws.subscribe(req):
            seen.append(r[field])
    except TransportQueryError as error:
        errors[name] = error.errors[0] if error.errors else None


async def test_a_running_turn_is_cancelled_first_then_the_session_goes_with_its_queue(
    server: InProcessServer, client: GraphQLClient, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sid = await client.create_session()
    running = (await client.submit(sid, "slow", "/sleep 1500 hold on"))["turn"]["id"]
    queued = (await client.submit(sid, "next", "after it"))["turn"]["id"]
    await client.wait_for_status(running, {"RUNNING"})
    seen: list[dict[str, Any]] = []
    closed: dict[str, Any] = {}
    async with ws_session(server.ws_url) as ws:
        task = asyncio.create_task(
            follow(ws, request(SESSION_EVENTS, s=sid, a=0), "sessionEvents", seen, closed, "error")
        )
        recorded = await db.fetchval("SELECT count(*) FROM events WHERE session_id = $1::uuid", sid)
        async with asyncio.timeout(10):
            while len(seen) < recorded:  # noqa: ASYNC110 - the subscriber has read the record
                await asyncio.sleep(0.02)
        with caplog.at_level(logging.INFO):
            deleted = await delete(client, sid, "bye")
            assert deleted == {"__typename": "SessionDeleted", "sessionId": sid, "replayed": False}
            async with asyncio.timeout(15):
                await task
            await worker_idle(server)

    # The subscriber saw the deletion's cancels, then (unless the deletion
    # removed it first) the running turn's stop, then the end of the session.
    reason = "the session is being deleted"
    expected = [
        ("turn.cancel_requested", running, reason),
        ("turn.cancelled", queued, reason),
        ("turn.cancelled", running, reason),
    ]
    after = [(e["type"], e["turnId"], e["data"].get("reason")) for e in seen[recorded:]]
    assert len(after) >= 2 and after == expected[: len(after)], seen
    assert closed["error"]["message"] == f"session {sid} was deleted", closed
    assert closed["error"]["extensions"] == {"code": "NOT_FOUND", "retryable": False}

    # With the worker done, nothing of the session is left and nothing was
    # written for its turns after the deletion.
    rows = await rows_of_session(db, sid)
    assert rows == only_its_deletion(rows)
    assert await db.fetchval(ORPHANS) == 0
    assert await db.fetchval("SELECT count(*) FROM events WHERE type = 'turn.write_refused'") == 0
    assert trouble(caplog) == []
    # Its process stopped it at a safe point (it did not run to its end).
    assert f"turn {running}: cancelled at a safe point" in caplog.messages
    for tid in (running, queued):
        assert await client.turn(tid) is None
    again = await delete(client, sid, "bye")
    assert again == {"__typename": "SessionDeleted", "sessionId": sid, "replayed": True}
    assert await rows_of_session(db, sid) == rows


async def test_a_deletion_racing_the_running_turns_own_end_leaves_no_orphan(
    server: InProcessServer, client: GraphQLClient, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(11)
    sessions = []
    with caplog.at_level(logging.INFO):
        for n in range(10):
            sid = await client.create_session()
            sessions.append(sid)
            # A short stream: the deletion lands before its end, during it or
            # just after it.
            tid = (await client.submit(sid, "k", f"/stream 4 {rng.randint(20, 50)}"))["turn"]["id"]
            await client.wait_for_status(tid, {"RUNNING", "COMPLETED"})
            await asyncio.sleep(rng.uniform(0, 0.12))
            deleted = await delete(client, sid, f"bye-{n}")
            assert deleted == {"__typename": "SessionDeleted", "sessionId": sid, "replayed": False}
            assert await client.turn(tid) is None
        await worker_idle(server)
    for sid in sessions:
        rows = await rows_of_session(db, sid)
        assert rows == only_its_deletion(rows)
    assert await db.fetchval("SELECT count(*) FROM turns") == 0
    assert await db.fetchval(ORPHANS) == 0
    assert trouble(caplog) == []


@pytest.fixture
async def held(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[InProcessServer, Path]]:
    """A server whose tool calls are held in flight, after their intent,
    until the release file exists; its deletions wait briefly."""
    release = tmp_path / "release"
    settings = fast_settings(delete_wait_s=0.3, hold_at="after_intent", hold_until=release)
    async with serve_in_process(database_url, settings) as srv:
        yield srv, release


async def test_a_turn_held_by_a_tool_call_answers_busy_with_its_cancel_recorded_and_the_key_goes_on(
    held: tuple[InProcessServer, Path], db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server, release = held
    client = GraphQLClient(server.url)
    try:
        sid = await client.create_session()
        running = (await client.submit(sid, "w", "/write a=1"))["turn"]["id"]
        queued = (await client.submit(sid, "next", "after it"))["turn"]["id"]
        async with asyncio.timeout(10):
            while not await db.fetchval(  # noqa: ASYNC110 - the call is now in flight
                "SELECT count(*) FROM events WHERE turn_id = $1::uuid AND type = 'tool.intent'",
                running,
            ):
                await asyncio.sleep(0.02)
        before = await db.fetchval("SELECT max(seq) FROM events WHERE session_id = $1::uuid", sid)

        with caplog.at_level(logging.INFO):
            busy = await delete(client, sid, "bye")
            assert busy["__typename"] == "SessionBusy" and busy["code"] == "SESSION_BUSY"
            assert busy["sessionId"] == sid and busy["turnId"] == running
            assert "same idempotency key" in busy["message"] and running in busy["message"]
            # Written: the cancels, nothing else. The running turn still runs, asked to
            # stop; the queued one ended; the key took nothing.
            written = await db.fetch(
                "SELECT type, turn_id::text AS turn, data ->> 'reason' AS reason FROM events "
                "WHERE session_id = $1::uuid AND seq > $2 ORDER BY seq",
                sid,
                before,
            )
            reason = "the session is being deleted"
            assert [tuple(r) for r in written] == [
                ("turn.cancel_requested", running, reason),
                ("turn.cancelled", queued, reason),
            ]
            statuses = dict(
                await db.fetch(
                    "SELECT id::text, status FROM turns WHERE session_id = $1::uuid", sid
                )
            )
            assert statuses == {running: "RUNNING", queued: "CANCELLED"}
            assert await db.fetchval("SELECT count(*) FROM session_deletions") == 0

            # The same key while the call is still held: asked once, not twice.
            assert (await delete(client, sid, "bye"))["__typename"] == "SessionBusy"
            last = await db.fetchval("SELECT max(seq) FROM events WHERE session_id = $1::uuid", sid)
            assert last == before + len(written)

            # The call goes on to its result (never cut); then the turn stops, and the
            # same key deletes.
            release.touch()
            async with asyncio.timeout(20):
                # Each answer is the record's: busy until the turn has stopped.
                while (answer := await delete(client, sid, "bye"))["__typename"] == "SessionBusy":  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            assert answer == {"__typename": "SessionDeleted", "sessionId": sid, "replayed": False}
            await worker_idle(server)
        rows = await rows_of_session(db, sid)
        assert rows == only_its_deletion(rows)
        assert await db.fetchval(ORPHANS) == 0
        # The held call's effect happened: the tool ran to its end.
        assert await db.fetchval("SELECT count(*) FROM synthetic_effects WHERE applied") == 1
        assert trouble(caplog) == []
    finally:
        await client.close()


async def test_queued_turns_go_with_the_session(
    server: InProcessServer, client: GraphQLClient, db: Any
) -> None:
    server.app.state.runtime.worker.drain()  # claim nothing: admitted turns stay QUEUED
    sid = await client.create_session()
    turns = [(await client.submit(sid, f"k{n}", f"n{n}"))["turn"] for n in range(3)]
    assert {t["status"] for t in turns} == {"QUEUED"}
    assert (await delete(client, sid, "bye"))["__typename"] == "SessionDeleted"
    assert await db.fetchval("SELECT count(*) FROM turns") == 0
    for t in turns:
        assert await client.turn(t["id"]) is None


@pytest.fixture
async def approving(database_url: str) -> AsyncIterator[InProcessServer]:
    async with serve_in_process(database_url, fast_settings(approve_unsafe=True)) as srv:
        yield srv


async def test_a_turn_waiting_for_a_decision_goes_at_once_and_its_call_never_runs(
    approving: InProcessServer, db: Any
) -> None:
    client = GraphQLClient(approving.url)
    try:
        sid = await client.create_session()
        waiting = (await client.submit(sid, "w", "/append a=1"))["turn"]["id"]
        queued = (await client.submit(sid, "n", "next"))["turn"]["id"]
        await client.wait_for_status(waiting, {"WAITING"})
        deleted = await delete(client, sid, "bye")
        assert deleted == {"__typename": "SessionDeleted", "sessionId": sid, "replayed": False}
        rows = await rows_of_session(db, sid)
        assert rows == only_its_deletion(rows)
        for tid in (waiting, queued):
            assert await client.turn(tid) is None
        # Deciding its call or cancelling either turn: as for turns that never were.
        never = str(uuid.uuid4())
        decision = {"index": 0, "decision": "APPROVE", "idempotencyKey": "d"}
        gone, absent = await whole_answers(
            client,
            DECIDE,
            {"i": {"turnId": waiting, **decision}},
            {"i": {"turnId": never, **decision}},
            (waiting, never),
        )
        assert gone == absent and '"TurnNotFound"' in gone, gone
        for tid in (waiting, queued):
            gone, absent = await whole_answers(
                client,
                CANCEL,
                {"i": {"turnId": tid, "idempotencyKey": "c"}},
                {"i": {"turnId": never, "idempotencyKey": "c"}},
                (tid, never),
            )
            assert gone == absent and '"TurnNotFound"' in gone, gone
        assert await db.fetchval("SELECT count(*) FROM synthetic_effects") == 0
    finally:
        await client.close()


async def test_after_deletion_everything_answers_as_for_a_session_that_never_existed(
    server: InProcessServer, client: GraphQLClient, db: Any
) -> None:
    recorded = await record_session(client, db)
    sid = recorded.session_id
    text, tid = recorded.turns["tools"]
    event = await db.fetchval("SELECT min(id) FROM events WHERE session_id = $1::uuid", sid)
    assert (await delete(client, sid, "bye"))["__typename"] == "SessionDeleted"

    never = str(uuid.uuid4())
    never_turn = str(uuid.uuid4())
    never_event = await db.fetchval("SELECT coalesce(max(id), 0) + 1000 FROM events")
    gone = await client.raw(READS, {"s": sid, "t": tid, "e": str(event)})
    absent = await client.raw(READS, {"s": never, "t": never_turn, "e": str(never_event)})
    assert gone == absent
    assert gone["data"]["session"] is None and gone["data"]["nodes"] == [None, None, None]
    assert gone["data"]["sessions"]["totalCount"] == 0

    # A replay under an old key, as a submission to a session that never was.
    replay = await client.submit(sid, "tools", text)
    fresh = await client.submit(never, "tools", text)
    assert replay["__typename"] == fresh["__typename"] == "SessionNotFound"
    assert without(replay["message"], sid) == without(fresh["message"], never)
    # The interrupted turn's decision, as for a turn that never was.
    decided = await client.execute(
        RESOLVE,
        {"i": {"turnId": recorded.interrupted_turn_id, "action": "RETRY", "idempotencyKey": "x"}},
    )
    unknown = await client.execute(
        RESOLVE, {"i": {"turnId": never_turn, "action": "RETRY", "idempotencyKey": "x"}}
    )
    a, b = decided["resolveInterruptedTurn"], unknown["resolveInterruptedTurn"]
    assert a["__typename"] == b["__typename"] == "TurnNotFound"
    assert without(a["message"], recorded.interrupted_turn_id) == without(b["message"], never_turn)

    # Cancelling a turn of it, or deciding a call of one: the whole answer as
    # for a turn that never existed.
    for query, extra in (
        (CANCEL, {"idempotencyKey": "c", "reason": "late"}),
        (DECIDE, {"index": 0, "decision": "APPROVE", "idempotencyKey": "d"}),
    ):
        for turn_id in (tid, recorded.interrupted_turn_id, recorded.retry_turn_id):
            gone_answer, never_answer = await whole_answers(
                client,
                query,
                {"i": {"turnId": turn_id, **extra}},
                {"i": {"turnId": never_turn, **extra}},
                (turn_id, never_turn),
            )
            assert gone_answer == never_answer and '"TurnNotFound"' in gone_answer, gone_answer

    # Subscriptions, as for a session and a turn that never existed.
    for query, gone_vars, never_vars, ids in (
        (SESSION_EVENTS, {"s": sid, "a": 0}, {"s": never, "a": 0}, (sid, never)),
        (TURN_COMPLETED, {"t": tid}, {"t": never_turn}, (tid, never_turn)),
        (TURN_EVENTS, {"t": tid, "a": 0}, {"t": never_turn, "a": 0}, (tid, never_turn)),
    ):
        e1 = await stream_error(server.ws_url, query, **gone_vars)
        e2 = await stream_error(server.ws_url, query, **never_vars)
        assert without(e1["message"], ids[0]) == without(e2["message"], ids[1])
        assert e1["extensions"] == e2["extensions"] == {"code": "NOT_FOUND", "retryable": False}

    # The deletion's own key still answers.
    again = await delete(client, sid, "bye")
    assert again == {"__typename": "SessionDeleted", "sessionId": sid, "replayed": True}


async def test_live_subscribers_are_closed_with_the_reason(
    server: InProcessServer, client: GraphQLClient
) -> None:
    server.app.state.runtime.worker.drain()  # the turn stays QUEUED, its end unseen
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", "waits"))["turn"]["id"]
    seen: list[dict[str, Any]] = []
    errors: dict[str, Any] = {}
    async with ws_session(server.ws_url) as ws:
        turn_seen: list[dict[str, Any]] = []
        tasks = [
            asyncio.create_task(follow(ws, req, field, into, errors, name))
            for req, field, into, name in (
                (request(SESSION_EVENTS, s=sid, a=0), "sessionEvents", seen, "events"),
                (request(TURN_COMPLETED, t=tid), "turnCompleted", [], "ended"),
                (request(TURN_EVENTS, t=tid, a=0), "turnEvents", turn_seen, "turn"),
            )
        ]
        async with asyncio.timeout(10):
            # All three registered (a plain attribute of the bus), the first event
            # seen by both event streams.
            while not (seen and turn_seen) or server.app.state.runtime.bus.subscriber_count < 3:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert (await delete(client, sid, "bye"))["__typename"] == "SessionDeleted"
        async with asyncio.timeout(15):
            await asyncio.gather(*tasks)
    assert [e["type"] for e in seen] == [e["type"] for e in turn_seen] == ["turn.started"]
    for name in ("events", "ended", "turn"):
        assert errors[name]["message"] == f"session {sid} was deleted", errors
        assert errors[name]["extensions"] == {"code": "NOT_FOUND", "retryable": False}


async def test_deletion_racing_admissions_leaves_admissions_it_removed_or_not_found(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    await client.submit(sid, "first", "hello")

    async def submit(n: int) -> dict[str, Any]:
        await asyncio.sleep(n * 0.002)
        return await client.submit(sid, f"k{n}", f"racing {n}")

    async def deletion() -> dict[str, Any]:
        await asyncio.sleep(0.02)
        # A turn admitted and claimed while it waits is asked to stop too.
        return await delete(client, sid, "bye")

    *answers, deleted = await asyncio.gather(*(submit(n) for n in range(40)), deletion())
    assert deleted == {"__typename": "SessionDeleted", "sessionId": sid, "replayed": False}
    kinds = {a["__typename"] for a in answers}
    assert kinds <= {"TurnAccepted", "SessionNotFound"}, kinds
    for a in answers:
        if a["__typename"] == "TurnAccepted":
            assert await client.turn(a["turn"]["id"]) is None
    rows = await rows_of_session(db, sid)
    assert rows == only_its_deletion(rows)
    assert await db.fetchval(ORPHANS) == 0


async def test_deletion_racing_subscriptions_ends_every_one_of_them(
    server: InProcessServer, client: GraphQLClient
) -> None:
    sid = await client.create_session()
    await client.wait_for_status((await client.submit(sid, "k", "hi"))["turn"]["id"], {"COMPLETED"})

    async def subscribe(n: int) -> str:
        await asyncio.sleep(n * 0.005)
        error = await stream_error(server.ws_url, SESSION_EVENTS, s=sid, a=0)
        assert error["extensions"]["code"] == "NOT_FOUND"
        return str(error["message"])

    async def deletion() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return await delete(client, sid, "bye")

    subscribers = asyncio.gather(*(subscribe(n) for n in range(20)))
    deleted = await deletion()
    messages = await subscribers
    assert deleted["__typename"] == "SessionDeleted"
    assert set(messages) <= {f"session {sid} was deleted", f"session {sid} not found"}


@pytest.mark.parametrize(
    ("session_id", "key", "field"),
    [
        ("not-a-uuid", "k", "sessionId"),
        ("7d1c3a52-0d8e-4c1b-9a43-2f6e8b1d5c07", "", "idempotencyKey"),
    ],
)
async def test_a_malformed_deletion_is_invalid_input(
    client: GraphQLClient, session_id: str, key: str, field: str
) -> None:
    answer = await delete(client, session_id, key)
    assert answer["__typename"] == "InvalidInput" and answer["field"] == field


async def test_another_tenants_session_is_not_found_and_keys_are_per_tenant(
    server: InProcessServer,
) -> None:
    engine = server.app.state.runtime.engine
    callers = []
    for name in ("alice", "bob"):
        caller = GraphQLClient(server.url)
        caller.http.headers["authorization"] = f"Bearer {await create_token(engine, name=name)}"
        callers.append(caller)
    alice, bob = callers
    try:
        # Until the server has seen that tokens exist, it serves open (one tenant).
        for _ in range(200):
            anonymous = await alice.http.post(
                "/graphql", json={"query": "{ __typename }"}, headers={"authorization": ""}
            )
            if anonymous.status_code == 401:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the server never asked for a token")
        mine = await alice.create_session()
        theirs = await bob.create_session()
        refused = await delete(bob, mine, "k")
        assert refused["__typename"] == "SessionNotFound"
        assert await alice.session(mine) is not None
        assert (await delete(bob, theirs, "k"))["replayed"] is False
        # The same key in another tenant names another deletion.
        assert await delete(alice, mine, "k") == {
            "__typename": "SessionDeleted",
            "sessionId": mine,
            "replayed": False,
        }
    finally:
        for caller in callers:
            await caller.close()
