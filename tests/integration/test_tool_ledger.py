"""The tool ledger: intents and results around every call, the synthetic
store beside the record, and what the record says after an interruption."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from keyturn.db.engine import create_engine
from keyturn.domain import ToolCallState
from keyturn.errors import EffectRefused
from keyturn.runtime.ledger import result_state
from keyturn.runtime.tools import SyntheticWrite
from tests.support import GraphQLClient, admin, fast_settings, serve_in_process

TOOL_CALLS = """
query($id: ID!) { turn(id: $id) {
  id status output retryOf
  toolCalls { index tool arguments effectKey kind state result reusedFrom }
  events { seq type data }
} }
"""

RESOLVE = """
mutation($i: ResolveInterruptedTurnInput!) { resolveInterruptedTurn(input: $i) {
  __typename
  ... on TurnResolved { action replayed turn { id status } retry { id status retryOf } }
  ... on UserError { code message }
  ... on UnsafeRetryRefused { index tool effectKey }
  ... on IdempotencyConflict { existingTurnId }
  ... on TurnNotInterrupted { status }
  ... on TurnAlreadyResolved { action retryTurnId }
} }
"""


async def turn(client: GraphQLClient, turn_id: str) -> dict[str, Any]:
    data = await client.execute(TOOL_CALLS, {"id": turn_id})
    assert data["turn"] is not None
    result: dict[str, Any] = data["turn"]
    return result


async def resolve(
    client: GraphQLClient, turn_id: str, action: str, key: str, force: bool | None = None
) -> dict[str, Any]:
    payload: dict[str, Any] = {"turnId": turn_id, "action": action, "idempotencyKey": key}
    if force is not None:
        payload["force"] = force
    data = await client.execute(RESOLVE, {"i": payload})
    result: dict[str, Any] = data["resolveInterruptedTurn"]
    return result


async def store(db: Any, key: str) -> list[Any]:
    return list(
        await db.fetch(
            "SELECT tool, applied, name, value FROM synthetic_effects WHERE effect_key = $1 "
            "ORDER BY id",
            key,
        )
    )


async def settled(client: GraphQLClient, turn_id: str, within: float = 20) -> dict[str, Any]:
    """The turn once INTERRUPTED and its idempotent unknowns reconciled."""
    deadline = time.monotonic() + within
    while True:
        t = await turn(client, turn_id)
        unsettled = [
            c
            for c in t["toolCalls"]
            if c["state"] == "OUTCOME_UNKNOWN" and c["kind"] == "IDEMPOTENT"
        ]
        if t["status"] == "INTERRUPTED" and not unsettled:
            return t
        assert time.monotonic() < deadline, t
        await asyncio.sleep(0.05)


async def take_over(db: Any, turn_id: str) -> None:
    """Another owner took the turn: the running process's lease renewal is
    refused and the lease is past, so a sweep interrupts it."""
    await db.execute(
        "UPDATE turns SET epoch = epoch + 1, lease_until = now() - interval '1 second' "
        "WHERE id = $1::uuid",
        turn_id,
    )


async def held_at(db: Any, turn_id: str, event_count: int, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while (
        await db.fetchval("SELECT count(*) FROM events WHERE turn_id = $1::uuid", turn_id)
        < event_count
    ):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)


async def test_each_call_has_an_intent_then_a_result_and_the_store_has_each_effect_once(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    accepted = await client.submit(sid, "w", "/write a=1 /write b=2 then reply")
    tid = accepted["turn"]["id"]
    done = await client.wait_for_status(tid, {"COMPLETED"})
    t = await turn(client, tid)
    assert [e["type"] for e in t["events"]] == [
        "turn.started",
        "turn.running",
        "tool.planned",
        "tool.intent",
        "tool.result",
        "tool.intent",
        "tool.result",
        "turn.delta",
        "turn.completed",
    ]
    assert [(c["index"], c["tool"], c["kind"], c["state"]) for c in t["toolCalls"]] == [
        (0, "synthetic_write", "IDEMPOTENT", "COMPLETED"),
        (1, "synthetic_write", "IDEMPOTENT", "COMPLETED"),
    ]
    assert t["toolCalls"][0]["arguments"] == {"name": "a", "value": "1"}
    assert [c["effectKey"] for c in t["toolCalls"]] == [f"{tid}/0", f"{tid}/1"]
    for n, (name, value) in enumerate([("a", "1"), ("b", "2")]):
        rows = await store(db, f"{tid}/{n}")
        assert [(r["applied"], r["name"], r["value"]) for r in rows] == [(True, name, value)]
    assert 'tool 1 synthetic_write {"name": "b", "value": "2"}' in done["output"]


async def test_read_only_and_unsafe_tools(client: GraphQLClient, db: Any) -> None:
    sid = await client.create_session()
    first = await client.submit(sid, "1", "/append x=1 /append x=2 /read x")
    t = await client.wait_for_status(first["turn"]["id"], {"COMPLETED"})
    assert '"value": "2"' in t["output"]
    calls = (await turn(client, first["turn"]["id"]))["toolCalls"]
    assert [c["kind"] for c in calls] == ["UNSAFE", "UNSAFE", "READ_ONLY"]
    assert [c["state"] for c in calls] == ["COMPLETED"] * 3


@pytest.fixture
async def holding(database_url: str, request: Any) -> AsyncIterator[GraphQLClient]:
    """A server whose tool calls stop and wait at the crash point the test names."""
    settings = fast_settings(crash_at=request.param, crash_after=1_000_000)
    async with serve_in_process(database_url, settings) as srv:
        c = GraphQLClient(srv.url)
        yield c
        await c.close()


# Events before call 1 of two: started, running, planned, intent and result of call 0.
_BEFORE_CALL_1 = 5


@pytest.mark.parametrize(
    ("holding", "events", "idempotent_state", "applied"),
    [
        ("before_intent:1", _BEFORE_CALL_1, "NOT_STARTED", False),
        ("after_intent:1", _BEFORE_CALL_1 + 1, "RECONCILED_NOT_APPLIED", False),
        ("after_write:1", _BEFORE_CALL_1 + 1, "RECONCILED_APPLIED", True),
        ("after_result:1", _BEFORE_CALL_1 + 2, "COMPLETED", True),
    ],
    indirect=["holding"],
)
async def test_after_an_interruption_the_record_agrees_with_the_store(
    holding: GraphQLClient, db: Any, events: int, idempotent_state: str, applied: bool
) -> None:
    client = holding
    sid = await client.create_session()
    w = (await client.submit(sid, "w", "/write a=1 /write b=2"))["turn"]["id"]
    sid2 = await client.create_session()
    u = (await client.submit(sid2, "u", "/append a=1 /append b=2"))["turn"]["id"]
    for tid in (w, u):
        await held_at(db, tid, events)
        await take_over(db, tid)
    tw = await settled(client, w)
    tu = await settled(client, u)
    assert [c["state"] for c in tw["toolCalls"]] == ["COMPLETED", idempotent_state]
    # The unsafe tool cannot be asked: between intent and result it stays unknown.
    unsafe_state = {"RECONCILED_NOT_APPLIED": "OUTCOME_UNKNOWN"}.get(idempotent_state)
    unsafe_state = unsafe_state or {"RECONCILED_APPLIED": "OUTCOME_UNKNOWN"}.get(
        idempotent_state, idempotent_state
    )
    assert [c["state"] for c in tu["toolCalls"]] == ["COMPLETED", unsafe_state]
    for tid in (w, u):
        rows = await store(db, f"{tid}/1")
        assert [r["applied"] for r in rows if r["applied"]] == ([True] if applied else [])
        assert len(await store(db, f"{tid}/0")) == 1
    reconciled = [e for e in tw["events"] if e["type"] == "tool.reconciled"]
    if idempotent_state.startswith("RECONCILED"):
        assert [(e["data"]["index"], e["data"]["applied"]) for e in reconciled] == [(1, applied)]
    else:
        assert reconciled == []
    if idempotent_state == "RECONCILED_NOT_APPLIED":
        # Asking settled the key as never applied: a late write cannot land.
        assert [r["applied"] for r in await store(db, f"{w}/1")] == [False]


@pytest.mark.parametrize("holding", ["after_write:1"], indirect=True)
async def test_retry_reuses_what_was_established_and_refuses_an_unknown_unsafe_call(
    holding: GraphQLClient, db: Any
) -> None:
    client = holding
    sid = await client.create_session()
    w = (await client.submit(sid, "w", "/write a=1 /write b=2"))["turn"]["id"]
    sid2 = await client.create_session()
    u = (await client.submit(sid2, "u", "/append a=1 /append b=2"))["turn"]["id"]
    for tid in (w, u):
        await held_at(db, tid, _BEFORE_CALL_1 + 1)
        await take_over(db, tid)
    await settled(client, w)
    await settled(client, u)

    # Idempotent: both calls are reused (one completed, one reconciled as applied).
    retried = await resolve(client, w, "RETRY", "r1")
    assert retried["__typename"] == "TurnResolved" and not retried["replayed"]
    new = retried["retry"]["id"]
    assert retried["retry"]["retryOf"] == w
    await client.wait_for_status(new, {"COMPLETED"})
    t = await turn(client, new)
    assert [(c["state"], c["reusedFrom"]) for c in t["toolCalls"]] == [
        ("COMPLETED", w),
        ("COMPLETED", w),
    ]
    assert [c["effectKey"] for c in t["toolCalls"]] == [f"{w}/0", f"{w}/1"]
    assert "tool.intent" not in [e["type"] for e in t["events"]]
    for n in (0, 1):
        assert [r["applied"] for r in await store(db, f"{w}/{n}")] == [True]
        assert await store(db, f"{new}/{n}") == []

    # The same key and request again: the same decision, nothing new.
    again = await resolve(client, w, "RETRY", "r1")
    assert again["__typename"] == "TurnResolved" and again["replayed"]
    assert again["retry"]["id"] == new
    changed = await resolve(client, w, "RETRY", "r1", force=True)
    assert changed["__typename"] == "IdempotencyConflict"
    assert changed["existingTurnId"] == new
    other_key = await resolve(client, w, "ABANDON", "r2")
    assert other_key["__typename"] == "TurnAlreadyResolved"
    assert other_key["retryTurnId"] == new
    assert await db.fetchval("SELECT count(*) FROM turns WHERE retry_of = $1::uuid", w) == 1

    # Unsafe with an unknown outcome: refused, naming the call, nothing written.
    before = await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1::uuid", sid2)
    refused = await resolve(client, u, "RETRY", "r1")
    assert refused["__typename"] == "UnsafeRetryRefused"
    assert (refused["index"], refused["effectKey"]) == (1, f"{u}/1")
    assert refused["code"] == "UNSAFE_RETRY_REFUSED"
    assert await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1::uuid", sid2) == before
    forced = await resolve(client, u, "RETRY", "r1", force=True)
    assert forced["__typename"] == "TurnResolved"
    fnew = forced["retry"]["id"]
    # Call 0 is reused; call 1 runs again and stops at this server's crash point.
    await held_at(db, fnew, 5)
    ft = await turn(client, fnew)
    assert [(c["state"], c["reusedFrom"]) for c in ft["toolCalls"]] == [
        ("COMPLETED", u),
        ("OUTCOME_UNKNOWN", None),
    ]
    intent = next(e for e in ft["events"] if e["type"] == "tool.intent")
    assert intent["data"]["previous"]["state"] == "OUTCOME_UNKNOWN"
    # Forced: the unsafe effect may now exist twice (once per effect key).
    assert len(await store(db, f"{u}/1")) == 1 and len(await store(db, f"{fnew}/1")) == 1


@pytest.mark.parametrize("holding", ["after_intent:0"], indirect=True)
async def test_retry_runs_again_a_call_settled_as_never_applied(
    holding: GraphQLClient, db: Any
) -> None:
    client = holding
    sid = await client.create_session()
    w = (await client.submit(sid, "w", "/write a=1"))["turn"]["id"]
    await held_at(db, w, 4)
    await take_over(db, w)
    t = await settled(client, w)
    assert [c["state"] for c in t["toolCalls"]] == ["RECONCILED_NOT_APPLIED"]
    new = (await resolve(client, w, "RETRY", "again"))["retry"]["id"]
    # The retry's call reaches the crash point too: it holds there, under its own key.
    await held_at(db, new, 4)
    intent = await db.fetchval(
        "SELECT data FROM events WHERE turn_id = $1::uuid AND type = 'tool.intent'", new
    )
    assert f'"effectKey": "{new}/0"' in intent


async def test_abandon_and_the_errors(client: GraphQLClient, db: Any) -> None:
    sid = await client.create_session()
    running = (await client.submit(sid, "s", "/sleep 60000"))["turn"]["id"]
    await client.wait_for_status(running, {"RUNNING"})
    not_yet = await resolve(client, running, "ABANDON", "a")
    assert not_yet["__typename"] == "TurnNotInterrupted" and not_yet["status"] == "RUNNING"
    await take_over(db, running)
    await client.wait_for_status(running, {"INTERRUPTED"})
    abandoned = await resolve(client, running, "ABANDON", "a")
    assert abandoned["__typename"] == "TurnResolved" and abandoned["retry"] is None
    assert (await resolve(client, running, "ABANDON", "a"))["replayed"] is True
    t = await turn(client, running)
    assert [e["type"] for e in t["events"]][-1] == "turn.abandoned"
    assert await db.fetchval("SELECT count(*) FROM events WHERE type = 'turn.abandoned'") == 1
    # One namespace of keys per session, both ways: the decision's key admits
    # no turn, and names the turn it decided.
    turns_before = await db.fetchval("SELECT count(*) FROM turns")
    submitted = await client.submit(sid, "a", "hello")
    assert submitted["__typename"] == "IdempotencyConflict", submitted
    assert submitted["existingTurnId"] == running
    assert await db.fetchval("SELECT count(*) FROM turns") == turns_before
    # A key a submitted turn holds names that turn.
    taken = await resolve(client, running, "RETRY", "s")
    assert taken["__typename"] == "IdempotencyConflict" and taken["existingTurnId"] == running
    missing = await resolve(client, "00000000-0000-0000-0000-000000000000", "RETRY", "x")
    assert missing["__typename"] == "TurnNotFound"
    bad = await resolve(client, "nope", "RETRY", "x")
    assert bad["__typename"] == "InvalidInput"


async def test_another_tenant_cannot_resolve_or_see_the_turn(
    client: GraphQLClient, db: Any, database_url: str
) -> None:
    from keyturn.db.engine import create_engine
    from keyturn.domain import ResolutionAction
    from keyturn.runtime.resolution import ResolutionOutcome, ResolutionRequest
    from keyturn.runtime.resolution import resolve as resolve_in_runtime

    sid = await client.create_session()
    tid = (await client.submit(sid, "s", "/sleep 60000"))["turn"]["id"]
    await client.wait_for_status(tid, {"RUNNING"})
    await take_over(db, tid)
    await client.wait_for_status(tid, {"INTERRUPTED"})
    engine = create_engine(database_url, pool_size=1)
    try:
        request = ResolutionRequest.parse(
            turn_id=tid, action=ResolutionAction.ABANDON, idempotency_key="k", force=False
        )
        other = await resolve_in_runtime(engine=engine, request=request, tenant="other")
        assert other.outcome is ResolutionOutcome.TURN_NOT_FOUND
        mine = await resolve_in_runtime(engine=engine, request=request, tenant="")
        assert mine.outcome is ResolutionOutcome.ACCEPTED
    finally:
        await engine.dispose()


@pytest.mark.parametrize("holding", ["after_intent:0"], indirect=True)
async def test_a_retry_racing_reconciliation_settles_first_and_runs_under_its_own_key(
    holding: GraphQLClient, db: Any, database_url: str
) -> None:
    """The interrupting process is still asking the tool about the unknown
    call (its store is slow: the test holds a lock on it) when the client
    retries. The retry must not run the old key meanwhile: asking would
    settle it as never applied and refuse the retry's write. It asks too,
    after the first question, and runs under its own key."""
    client = holding
    sid = await client.create_session()
    w = (await client.submit(sid, "w", "/write a=1"))["turn"]["id"]
    await held_at(db, w, 4)
    blocker: Any = await admin(database_url)
    try:
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute("LOCK TABLE synthetic_effects IN ACCESS EXCLUSIVE MODE")
        await take_over(db, w)
        await client.wait_for_status(w, {"INTERRUPTED"})
        before = await turn(client, w)
        assert [c["state"] for c in before["toolCalls"]] == ["OUTCOME_UNKNOWN"]
        new = (await resolve(client, w, "RETRY", "race"))["retry"]["id"]
        await client.wait_for_status(new, {"RUNNING"})
        await asyncio.sleep(0.3)  # the retry is planning its call now
        await lock.rollback()
    finally:
        await blocker.close()
    # The retry holds at this server's crash point, after its intent.
    await held_at(db, new, 4)
    t = await settled(client, w)
    assert [c["state"] for c in t["toolCalls"]] == ["RECONCILED_NOT_APPLIED"]
    intent = await db.fetchval(
        "SELECT data FROM events WHERE turn_id = $1::uuid AND type = 'tool.intent'", new
    )
    assert f'"effectKey": "{new}/0"' in intent
    # The question was answered before the retry planned its call.
    order = await db.fetch(
        "SELECT type FROM events WHERE session_id = $1::uuid "
        "AND type IN ('tool.reconciled', 'tool.planned') AND seq > "
        "(SELECT admit_seq FROM turns WHERE id = $2::uuid) ORDER BY seq",
        sid,
        new,
    )
    assert [r["type"] for r in order] == ["tool.reconciled", "tool.planned"]


async def test_a_write_whose_key_was_settled_as_never_applied_is_refused_not_completed(
    database_url: str, db: Any
) -> None:
    engine = create_engine(database_url, pool_size=2)
    try:
        tool = SyntheticWrite(engine)
        # Asked first (as reconciliation asks): never applied, and now it never will be.
        assert await tool.applied("turn/0") is False
        with pytest.raises(EffectRefused):
            await tool.run({"name": "n", "value": "v"}, effect_key="turn/0")
        assert await db.fetchval("SELECT count(*) FROM synthetic_effects WHERE name = 'n'") == 0
    finally:
        await engine.dispose()
    # What the runner records for a refusal, and what the ledger makes of it.
    flags = {"reconciled": True, "applied": False}
    assert result_state(flags) is ToolCallState.RECONCILED_NOT_APPLIED


async def test_a_retry_racing_reconciliation_completes_with_the_effect_applied_once(
    database_url: str, db: Any, tmp_path: Path
) -> None:
    """The interleaving that once lost a write while the record
    said COMPLETED: the original turn dies after the intent of a keyed
    /write; the client retries while the interrupting process is still
    asking the store whether that key was applied (the test holds a lock on
    the store). The retry waits for that answer (or asks itself), then runs
    under its own key; the store has the effect exactly once, and the
    retry's call is COMPLETED only because its write applied."""
    release = tmp_path / "release"
    settings = fast_settings(hold_at="after_intent:0", hold_until=release)
    async with serve_in_process(database_url, settings) as srv:
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        w = (await client.submit(sid, "w", "/write a=1"))["turn"]["id"]
        await held_at(db, w, 4)  # started, running, planned, intent: held there
        blocker: Any = await admin(database_url)
        try:
            lock = blocker.transaction()
            await lock.start()
            await blocker.execute("LOCK TABLE synthetic_effects IN ACCESS EXCLUSIVE MODE")
            await take_over(db, w)
            await client.wait_for_status(w, {"INTERRUPTED"})
            # The interrupting process's question is waiting on the store now.
            asked = await turn(client, w)
            assert [c["state"] for c in asked["toolCalls"]] == ["OUTCOME_UNKNOWN"]
            new = (await resolve(client, w, "RETRY", "race"))["retry"]["id"]
            await client.wait_for_status(new, {"RUNNING"})
            await asyncio.sleep(0.3)  # the retry is settling its earlier call now
            await lock.rollback()
        finally:
            await blocker.close()
        # The retry's call reaches the hold after its intent; let it go on.
        await held_at(db, new, 4)
        release.touch()
        done = await client.wait_for_status(new, {"COMPLETED", "INTERRUPTED", "FAILED"})
        assert done["status"] == "COMPLETED", done
        t = await turn(client, new)
        assert [(c["state"], c["effectKey"]) for c in t["toolCalls"]] == [("COMPLETED", f"{new}/0")]
        result = next(e for e in t["events"] if e["type"] == "tool.result")
        assert result["data"]["result"].get("applied") is not False, result
        original = await settled(client, w)
        assert [c["state"] for c in original["toolCalls"]] == ["RECONCILED_NOT_APPLIED"]
        # Exactly once: the old key is settled as never applied, the retry's applied.
        assert [r["applied"] for r in await store(db, f"{w}/0")] == [False]
        assert [(r["applied"], r["name"], r["value"]) for r in await store(db, f"{new}/0")] == [
            (True, "a", "1")
        ]
        applied = await db.fetchval(
            "SELECT count(*) FROM synthetic_effects WHERE name = 'a' AND applied"
        )
        assert applied == 1
        # The question was answered, once, before the retry planned its call.
        order = await db.fetch(
            "SELECT type FROM events WHERE session_id = $1::uuid "
            "AND type IN ('tool.reconciled', 'tool.planned') AND seq > "
            "(SELECT admit_seq FROM turns WHERE id = $2::uuid) ORDER BY seq",
            sid,
            new,
        )
        assert [r["type"] for r in order] == ["tool.reconciled", "tool.planned"]
        await client.close()
