"""Approval of tool calls: a turn that waits for a person, holds no lease,
and resumes from its record on whichever process claims it after the decision."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from keyturn.db import leases
from keyturn.db.engine import connect
from keyturn.runtime.auth import create_token
from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process
from tests.support.client import SESSION_EVENTS, request, ws_session

TURN = """
query($id: ID!) { turn(id: $id) {
  id status output epoch owner
  toolCalls { index tool arguments effectKey kind state result }
  events { seq type data }
} }
"""

DECIDE = """
mutation($i: DecideToolCallInput!) { decideToolCall(input: $i) {
  __typename
  ... on ToolCallDecided { index decision replayed turn { id status } }
  ... on UserError { code message }
  ... on ToolCallAlreadyDecided { turnId index decision }
  ... on ToolCallNotAwaitingApproval { turnId index status }
  ... on IdempotencyConflict { idempotencyKey existingTurnId }
  ... on TurnNotFound { turnId }
  ... on InvalidInput { field }
} }
"""

PENDING = """
query($first: Int, $after: String) { pendingApprovals(first: $first, after: $after) {
  edges { cursor node { index tool arguments kind effectKey turn { id status } } }
  pageInfo { hasNextPage endCursor }
} }
"""


def approving(**overrides: Any) -> Any:
    return fast_settings(approve_unsafe=True, **overrides)


@pytest.fixture
async def server(database_url: str) -> AsyncIterator[InProcessServer]:
    async with serve_in_process(database_url, approving()) as srv:
        yield srv


async def turn(client: GraphQLClient, turn_id: str) -> dict[str, Any]:
    data = await client.execute(TURN, {"id": turn_id})
    assert data["turn"] is not None
    result: dict[str, Any] = data["turn"]
    return result


async def decide(
    client: GraphQLClient,
    turn_id: str,
    index: int,
    decision: str,
    key: str,
    note: str | None = None,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "turnId": turn_id,
        "index": index,
        "decision": decision,
        "idempotencyKey": key,
    }
    if note is not None:
        payload["note"] = note
    data = await client.execute(DECIDE, {"i": payload})
    result: dict[str, Any] = data["decideToolCall"]
    return result


async def waiting(client: GraphQLClient, turn_id: str, within: float = 20) -> dict[str, Any]:
    """The turn once WAITING, its request recorded."""
    deadline = time.monotonic() + within
    while True:
        t = await turn(client, turn_id)
        if t["status"] == "WAITING":
            return t
        assert t["status"] in {"QUEUED", "RUNNING"}, t
        assert time.monotonic() < deadline, t
        await asyncio.sleep(0.05)


async def store(db: Any, key: str) -> list[Any]:
    return list(
        await db.fetch(
            "SELECT tool, name, value FROM synthetic_effects WHERE effect_key = $1 ORDER BY id",
            key,
        )
    )


def types(t: dict[str, Any]) -> list[str]:
    return [e["type"] for e in t["events"]]


async def test_an_unsafe_call_waits_holding_no_lease_and_approval_runs_it_once(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", "/append x=1"))["turn"]["id"]
    t = await waiting(client, tid)
    assert types(t) == ["turn.started", "turn.running", "tool.planned", "tool.approval_requested"]
    request = t["events"][-1]["data"]
    assert request == {
        "index": 0,
        "tool": "synthetic_append",
        "arguments": {"name": "x", "value": "1"},
        "kind": "UNSAFE",
        "effectKey": f"{tid}/0",
        "epoch": 1,
    }
    assert [c["state"] for c in t["toolCalls"]] == ["AWAITING_APPROVAL"]
    assert t["owner"] is None
    row = await db.fetchrow("SELECT lease_until, owner FROM turns WHERE id = $1::uuid", tid)
    assert (row["lease_until"], row["owner"]) == (None, None)
    assert await store(db, f"{tid}/0") == []
    # A later turn of the session waits behind it.
    later = (await client.submit(sid, "k2", "after"))["turn"]["id"]
    await asyncio.sleep(1.0)  # several claim polls
    assert (await turn(client, later))["status"] == "QUEUED"

    pending = (await client.execute(PENDING, {"first": 10}))["pendingApprovals"]
    assert [(e["node"]["turn"]["id"], e["node"]["index"]) for e in pending["edges"]] == [(tid, 0)]
    node = pending["edges"][0]["node"]
    assert (node["tool"], node["kind"], node["effectKey"]) == (
        "synthetic_append",
        "UNSAFE",
        f"{tid}/0",
    )
    assert pending["pageInfo"]["hasNextPage"] is False

    decided = await decide(client, tid, 0, "APPROVE", "yes")
    assert decided["__typename"] == "ToolCallDecided"
    assert (decided["index"], decided["decision"], decided["replayed"]) == (0, "APPROVE", False)
    done = await client.wait_for_status(tid, {"COMPLETED"})
    assert done["epoch"] == 2
    t = await turn(client, tid)
    assert types(t) == [
        "turn.started",
        "turn.running",
        "tool.planned",
        "tool.approval_requested",
        "tool.approved",
        "turn.running",
        "tool.intent",
        "tool.result",
        "turn.delta",
        "turn.completed",
    ]
    assert t["events"][6]["data"]["epoch"] == 2
    assert [c["state"] for c in t["toolCalls"]] == ["COMPLETED"]
    assert [(r["name"], r["value"]) for r in await store(db, f"{tid}/0")] == [("x", "1")]
    assert 'tool 0 synthetic_append {"name": "x", "value": "1"}: {"applied": true}' in (t["output"])
    # The model was not asked again for the round planned: one plan only.
    assert types(t).count("tool.planned") == 1
    assert (await client.execute(PENDING, {"first": 10}))["pendingApprovals"]["edges"] == []
    await client.wait_for_status(later, {"COMPLETED"})
    # The deltas of the turn make up its output.
    deltas = [e["data"]["text"] for e in t["events"] if e["type"] == "turn.delta"]
    assert "".join(deltas) == t["output"]


async def test_a_rejected_call_never_runs_and_the_model_is_told(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", "/append x=1"))["turn"]["id"]
    await waiting(client, tid)
    decided = await decide(client, tid, 0, "REJECT", "no", note="not today")
    assert (decided["__typename"], decided["decision"]) == ("ToolCallDecided", "REJECT")
    done = await client.wait_for_status(tid, {"COMPLETED"})
    t = await turn(client, tid)
    assert "tool.intent" not in types(t)
    assert "tool.result" not in types(t)
    rejected = [e for e in t["events"] if e["type"] == "tool.rejected"]
    assert len(rejected) == 1
    assert rejected[0]["data"]["note"] == "not today"
    refusal = {"error": "refused by a person: not today"}
    assert t["toolCalls"] == [
        {
            "index": 0,
            "tool": "synthetic_append",
            "arguments": {"name": "x", "value": "1"},
            "effectKey": f"{tid}/0",
            "kind": "UNSAFE",
            "state": "REJECTED",
            "result": refusal,
        }
    ]
    assert await store(db, f"{tid}/0") == []
    assert (
        'tool 0 synthetic_append {"name": "x", "value": "1"}: '
        '{"error": "refused by a person: not today"}' in done["output"]
    )


async def test_a_mixed_turn_resumes_in_order_without_running_a_call_twice(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", "/write a=1 /append b=2 /read a"))["turn"]["id"]
    t = await waiting(client, tid)
    assert [c["state"] for c in t["toolCalls"]] == ["COMPLETED", "AWAITING_APPROVAL", "NOT_STARTED"]
    assert len(await store(db, f"{tid}/0")) == 1
    assert await decide(client, tid, 1, "APPROVE", "go") == {
        "__typename": "ToolCallDecided",
        "index": 1,
        "decision": "APPROVE",
        "replayed": False,
        "turn": {"id": tid, "status": "QUEUED"},
    }
    done = await client.wait_for_status(tid, {"COMPLETED"})
    t = await turn(client, tid)
    assert [(c["index"], c["state"]) for c in t["toolCalls"]] == [
        (0, "COMPLETED"),
        (1, "COMPLETED"),
        (2, "COMPLETED"),
    ]
    ledger = [
        (e["type"], e["data"].get("index")) for e in t["events"] if e["type"].startswith("tool.")
    ]
    assert ledger == [
        ("tool.planned", 0),
        ("tool.intent", 0),
        ("tool.result", 0),
        ("tool.approval_requested", 1),
        ("tool.approved", 1),
        ("tool.intent", 1),
        ("tool.result", 1),
        ("tool.intent", 2),
        ("tool.result", 2),
    ]
    assert len(await store(db, f"{tid}/0")) == 1  # the write is not repeated
    assert len(await store(db, f"{tid}/1")) == 1
    lines = [line for line in done["output"].splitlines() if line.startswith("tool ")]
    assert lines == [
        'tool 0 synthetic_write {"name": "a", "value": "1"}: '
        '{"alreadyApplied": false, "applied": true}',
        'tool 1 synthetic_append {"name": "b", "value": "2"}: {"applied": true}',
        'tool 2 synthetic_read {"name": "a"}: {"value": "1"}',
    ]


async def test_decisions_are_idempotent_under_their_key(client: GraphQLClient, db: Any) -> None:
    sid = await client.create_session()
    tid = (await client.submit(sid, "turn-key", "/append x=1"))["turn"]["id"]
    await waiting(client, tid)
    first = await decide(client, tid, 0, "APPROVE", "d1", note="ok")
    assert (first["__typename"], first["replayed"]) == ("ToolCallDecided", False)
    await client.wait_for_status(tid, {"COMPLETED"})
    count = await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1::uuid", sid)
    again = await decide(client, tid, 0, "APPROVE", "d1", note="ok")
    assert (again["__typename"], again["decision"], again["replayed"]) == (
        "ToolCallDecided",
        "APPROVE",
        True,
    )
    changed = await decide(client, tid, 0, "REJECT", "d1")
    assert (changed["__typename"], changed["code"], changed["existingTurnId"]) == (
        "IdempotencyConflict",
        "IDEMPOTENCY_CONFLICT",
        tid,
    )
    other_note = await decide(client, tid, 0, "APPROVE", "d1", note="changed")
    assert other_note["__typename"] == "IdempotencyConflict"
    # A key a turn of the session already holds names that turn.
    taken = await decide(client, tid, 0, "APPROVE", "turn-key")
    assert (taken["__typename"], taken["existingTurnId"]) == ("IdempotencyConflict", tid)
    # Another key: the call is decided already.
    late = await decide(client, tid, 0, "REJECT", "d2")
    assert late == {
        "__typename": "ToolCallAlreadyDecided",
        "code": "TOOL_CALL_ALREADY_DECIDED",
        "message": late["message"],
        "turnId": tid,
        "index": 0,
        "decision": "APPROVE",
    }
    # Decision keys share the session's namespace: a submission under one
    # admits no turn.
    taken_by_decision = await client.submit(sid, "d1", "hello")
    assert (taken_by_decision["__typename"], taken_by_decision["existingTurnId"]) == (
        "IdempotencyConflict",
        tid,
    )
    assert await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1::uuid", sid) == count


async def test_100_concurrent_decisions_under_different_keys_one_wins(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", "/append x=1"))["turn"]["id"]
    await waiting(client, tid)
    answers = await asyncio.gather(
        *(decide(client, tid, 0, "APPROVE" if n % 2 else "REJECT", f"key-{n}") for n in range(100))
    )
    won = [a for a in answers if a["__typename"] == "ToolCallDecided"]
    assert len(won) == 1
    lost = [a for a in answers if a["__typename"] == "ToolCallAlreadyDecided"]
    assert len(lost) == 99
    assert {a["decision"] for a in lost} == {won[0]["decision"]}
    decisions = await db.fetchval(
        "SELECT count(*) FROM events WHERE turn_id = $1::uuid "
        "AND type IN ('tool.approved', 'tool.rejected')",
        tid,
    )
    assert decisions == 1
    await client.wait_for_status(tid, {"COMPLETED"})
    expected = 1 if won[0]["decision"] == "APPROVE" else 0
    assert len(await store(db, f"{tid}/0")) == expected


async def test_100_concurrent_identical_decisions_write_one(client: GraphQLClient, db: Any) -> None:
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", "/append x=1"))["turn"]["id"]
    await waiting(client, tid)
    answers = await asyncio.gather(*(decide(client, tid, 0, "APPROVE", "same") for _ in range(100)))
    assert {a["__typename"] for a in answers} == {"ToolCallDecided"}
    assert sorted(a["replayed"] for a in answers) == [False] + [True] * 99


async def test_a_call_that_is_not_waiting_and_bad_input(client: GraphQLClient, db: Any) -> None:
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", "/write a=1"))["turn"]["id"]  # idempotent: no approval
    await client.wait_for_status(tid, {"COMPLETED"})
    count = await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1::uuid", sid)
    answer = await decide(client, tid, 0, "APPROVE", "d")
    assert (answer["__typename"], answer["code"], answer["status"], answer["index"]) == (
        "ToolCallNotAwaitingApproval",
        "TOOL_CALL_NOT_AWAITING_APPROVAL",
        "COMPLETED",
        0,
    )
    waiting_tid = (await client.submit(sid, "k2", "/append x=1"))["turn"]["id"]
    await waiting(client, waiting_tid)
    count = await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1::uuid", sid)
    wrong_index = await decide(client, waiting_tid, 5, "APPROVE", "d5")
    assert wrong_index["__typename"] == "ToolCallNotAwaitingApproval"
    unknown = await decide(client, "00000000-0000-0000-0000-000000000000", 0, "APPROVE", "x")
    assert (unknown["__typename"], unknown["code"]) == ("TurnNotFound", "TURN_NOT_FOUND")
    mistakes: list[tuple[dict[str, Any], str]] = [
        ({"turnId": "nope"}, "turnId"),
        ({"idempotencyKey": ""}, "idempotencyKey"),
        ({"index": -1}, "index"),
        ({"note": "x" * 2001}, "note"),
    ]
    for bad, field in mistakes:
        payload = {
            "turnId": waiting_tid,
            "index": 0,
            "decision": "APPROVE",
            "idempotencyKey": "b",
            **bad,
        }
        data = await client.execute(DECIDE, {"i": payload})
        assert data["decideToolCall"]["__typename"] == "InvalidInput"
        assert data["decideToolCall"]["field"] == field
    assert await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1::uuid", sid) == count
    assert (await turn(client, waiting_tid))["status"] == "WAITING"


async def test_another_tenant_sees_no_pending_call_and_cannot_decide(
    server: InProcessServer, db: Any
) -> None:
    engine = server.app.state.runtime.engine
    alice_token = await create_token(engine, name="alice")
    bob_token = await create_token(engine, name="bob")
    await asyncio.sleep(0.4)  # the "tokens exist" answer is cached this long
    alice, bob = GraphQLClient(server.url), GraphQLClient(server.url)
    alice.http.headers["authorization"] = f"Bearer {alice_token}"
    bob.http.headers["authorization"] = f"Bearer {bob_token}"
    try:
        sid = await alice.create_session()
        tid = (await alice.submit(sid, "k", "/append x=1"))["turn"]["id"]
        await waiting(alice, tid)
        assert len((await alice.execute(PENDING))["pendingApprovals"]["edges"]) == 1
        assert (await bob.execute(PENDING))["pendingApprovals"]["edges"] == []
        answer = await decide(bob, tid, 0, "APPROVE", "mine")
        assert (answer["__typename"], answer["turnId"]) == ("TurnNotFound", tid)
        assert (await turn(alice, tid))["status"] == "WAITING"
    finally:
        await alice.close()
        await bob.close()


async def test_pending_approvals_pages_forward(client: GraphQLClient) -> None:
    tids = []
    for n in range(3):
        sid = await client.create_session()
        tids.append((await client.submit(sid, "k", f"/append x={n}"))["turn"]["id"])
    for tid in tids:
        await waiting(client, tid)
    seen: list[str] = []
    after = None
    while True:
        page = (await client.execute(PENDING, {"first": 2, "after": after}))["pendingApprovals"]
        seen += [e["node"]["turn"]["id"] for e in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    # Every waiting call once, across the pages. (They are listed in the
    # order their requests were recorded, which for three sessions run at
    # once need not be the order they were submitted.)
    assert len(seen) == len(set(seen)) and sorted(seen) == sorted(tids)


async def test_a_waiting_turn_is_decided_after_every_process_restarted(
    database_url: str, db: Any
) -> None:
    async with serve_in_process(database_url, approving()) as first:
        c = GraphQLClient(first.url)
        sid = await c.create_session()
        tid = (await c.submit(sid, "k", "/write a=1 /append b=2"))["turn"]["id"]
        await waiting(c, tid)
        await c.close()
    async with serve_in_process(database_url, approving()) as second:
        c = GraphQLClient(second.url)
        t = await turn(c, tid)
        assert t["status"] == "WAITING"  # a restart neither interrupts nor runs it
        pending = (await c.execute(PENDING))["pendingApprovals"]["edges"]
        assert [e["node"]["turn"]["id"] for e in pending] == [tid]
        assert (await decide(c, tid, 1, "APPROVE", "go"))["__typename"] == "ToolCallDecided"
        done = await c.wait_for_status(tid, {"COMPLETED"})
        assert done["epoch"] == 2
        assert len(await store(db, f"{tid}/0")) == 1
        assert len(await store(db, f"{tid}/1")) == 1
        await c.close()


async def test_the_request_reaches_a_live_subscription_as_it_is_recorded(
    server: InProcessServer, client: GraphQLClient
) -> None:
    sid = await client.create_session()
    seen: list[str] = []
    async with ws_session(server.ws_url) as ws:

        async def follow() -> None:
            async for event in ws.subscribe(request(SESSION_EVENTS, s=sid, a=0)):
                seen.append(event["sessionEvents"]["type"])
                if seen[-1] == "tool.approval_requested":
                    return

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.3)
        await client.submit(sid, "k", "/append x=1")
        await asyncio.wait_for(task, 20)
    assert seen == ["turn.started", "turn.running", "tool.planned", "tool.approval_requested"]


async def test_two_waiting_calls_of_a_round_are_asked_one_after_the_other(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", "/append a=1 /append b=2"))["turn"]["id"]
    await waiting(client, tid)
    assert (await decide(client, tid, 0, "APPROVE", "first"))["__typename"] == "ToolCallDecided"
    # Resumed under epoch 2, it runs call 0 and stops again at call 1.
    deadline = time.monotonic() + 20
    while True:
        t = await turn(client, tid)
        if t["status"] == "WAITING" and t["epoch"] == 2:
            break
        assert time.monotonic() < deadline, t
        await asyncio.sleep(0.05)
    assert [c["state"] for c in t["toolCalls"]] == ["COMPLETED", "AWAITING_APPROVAL"]
    early = await decide(client, tid, 0, "REJECT", "again")
    assert (early["__typename"], early["decision"]) == ("ToolCallAlreadyDecided", "APPROVE")
    assert (await decide(client, tid, 1, "REJECT", "second"))["__typename"] == "ToolCallDecided"
    done = await client.wait_for_status(tid, {"COMPLETED"})
    assert done["epoch"] == 3
    t = await turn(client, tid)
    assert [c["state"] for c in t["toolCalls"]] == ["COMPLETED", "REJECTED"]
    assert types(t).count("tool.planned") == 1
    assert len(await store(db, f"{tid}/0")) == 1
    assert await store(db, f"{tid}/1") == []


async def test_a_waiting_turn_is_cancelled_at_once(client: GraphQLClient, db: Any) -> None:
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", "/append x=1"))["turn"]["id"]
    await waiting(client, tid)
    data = await client.execute(
        """mutation($i: CancelTurnInput!) { cancelTurn(input: $i) {
             __typename ... on TurnCancellation { turn { status } } } }""",
        {"i": {"turnId": tid, "idempotencyKey": "stop"}},
    )
    assert data["cancelTurn"] == {"__typename": "TurnCancellation", "turn": {"status": "CANCELLED"}}
    assert (await client.execute(PENDING))["pendingApprovals"]["edges"] == []
    late = await decide(client, tid, 0, "APPROVE", "late")
    assert (late["__typename"], late["status"]) == ("ToolCallNotAwaitingApproval", "CANCELLED")
    await asyncio.sleep(1.0)  # several claim polls: nothing runs it
    assert (await turn(client, tid))["status"] == "CANCELLED"
    assert await store(db, f"{tid}/0") == []


async def test_a_later_turn_sees_the_refusal_as_the_call_result(
    server: InProcessServer, client: GraphQLClient
) -> None:
    sid = await client.create_session()
    tid = (await client.submit(sid, "k", "/append x=1"))["turn"]["id"]
    await waiting(client, tid)
    await decide(client, tid, 0, "REJECT", "no", note="no appends")
    await client.wait_for_status(tid, {"COMPLETED"})
    later = (await client.submit(sid, "k2", "and now?"))["turn"]["id"]
    done = await client.wait_for_status(later, {"COMPLETED"})
    assert "1 earlier turn(s)" in done["output"]
    async with connect(server.app.state.runtime.engine) as conn:
        rows = await leases.history(conn, session_id=uuid.UUID(sid), admit_seq=10**9, limit=5)
    assert [
        (t["index"], t["tool"], t["arguments"], t["result"]) for r in rows for t in r.tools
    ] == [
        (
            0,
            "synthetic_append",
            {"name": "x", "value": "1"},
            {"error": "refused by a person: no appends"},
        )
    ]
