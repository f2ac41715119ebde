"""Admission rules: accept, replay, conflict, new key, scope, races, bad input."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from keyturn.domain import History, Multitask
from keyturn.runtime.validation import fingerprint
from tests.support import GraphQLClient, counts, new_key


async def test_accepted_turn_and_its_started_event_are_saved_before_the_answer(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    result = await client.submit(sid, "k1", "hello")
    assert result["__typename"] == "TurnAccepted"
    assert result["replayed"] is False
    turn_id = result["turn"]["id"]
    # The answer came back: the row and its event are already committed.
    row = await db.fetchrow("SELECT status, input, history FROM turns WHERE id = $1::uuid", turn_id)
    assert row["input"] == "hello" and row["history"] == "FULL"
    first = await db.fetchrow(
        "SELECT seq, type FROM events WHERE turn_id = $1::uuid ORDER BY seq LIMIT 1", turn_id
    )
    assert (first["seq"], first["type"]) == (1, "turn.started")
    done = await client.wait_for_status(turn_id, {"COMPLETED"})
    assert done["output"].startswith("fixture reply to: hello")
    assert [e["type"] for e in done["events"]] == [
        "turn.started",
        "turn.running",
        "turn.delta",
        "turn.completed",
    ]


async def test_same_key_same_request_replays_the_original_and_writes_nothing(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    first = await client.submit(sid, "k1", "/sleep 1500 hold on")
    tid = first["turn"]["id"]
    before = await counts(db, sid)
    # While it is still queued or running (its own running event may land
    # meanwhile, so compare turns and turn.started events here)...
    again = await client.submit(sid, "k1", "/sleep 1500 hold on")
    assert again["__typename"] == "TurnReplayed"
    assert again["replayed"] is True
    assert again["turn"]["id"] == tid
    assert again["turn"]["status"] in {"QUEUED", "RUNNING"}
    assert (await counts(db, sid))[:2] == before[:2] == (1, 1)
    # ...and long after it ended.
    await client.wait_for_status(tid, {"COMPLETED"})
    before = await counts(db, sid)
    later = await client.submit(sid, "k1", "/sleep 1500 hold on")
    assert later["__typename"] == "TurnReplayed"
    assert later["turn"]["id"] == tid and later["turn"]["status"] == "COMPLETED"
    assert await counts(db, sid) == before


async def test_omitted_history_is_the_same_request_as_the_session_default(
    client: GraphQLClient, db: Any
) -> None:
    for default in ("FULL", "NONE"):
        sid = await client.create_session(default)
        first = await client.submit(sid, "k", "hi")
        assert first["turn"]["history"] == default
        explicit = await client.submit(sid, "k", "hi", history=default)
        assert explicit["__typename"] == "TurnReplayed"
        assert explicit["turn"]["id"] == first["turn"]["id"]
        other = "NONE" if default == "FULL" else "FULL"
        changed = await client.submit(sid, "k", "hi", history=other)
        assert changed["__typename"] == "IdempotencyConflict"
        assert changed["existingTurnId"] == first["turn"]["id"]
        assert (await counts(db, sid))[0] == 1


@pytest.mark.parametrize("multitask", [None, "ENQUEUE", "REJECT"])
@pytest.mark.parametrize("history", [None, "FULL", "NONE"])
@pytest.mark.parametrize("policy", ["ENQUEUE", "REJECT"])
@pytest.mark.parametrize("default", ["FULL", "NONE"])
async def test_a_turn_saves_the_effective_requests_fingerprint_and_started_event(
    client: GraphQLClient,
    db: Any,
    default: str,
    policy: str,
    history: str | None,
    multitask: str | None,
) -> None:
    """Whatever the session's defaults and whichever the request spells out,
    the turn holds the fingerprint of the request with the defaults
    resolved, and its turn.started says the same; the same request with the
    defaults spelled out replays it."""
    created = await client.execute(
        "mutation($h: HistoryMode, $m: Multitask) {"
        " createSession(input: {defaultHistory: $h, multitask: $m}) { id } }",
        {"h": default, "m": policy},
    )
    sid = created["createSession"]["id"]
    payload: dict[str, Any] = {"sessionId": sid, "idempotencyKey": "k", "input": "hi"}
    if history is not None:
        payload["history"] = history
    if multitask is not None:
        payload["multitask"] = multitask
    first = (await client.execute(MUTATION, {"input": payload}))["submitTurn"]
    assert first["__typename"] == "TurnAccepted", first
    effective = History(history or default)
    policy_used = multitask or policy
    row = await db.fetchrow(
        "SELECT t.fingerprint, t.history, e.data::text AS data FROM turns t"
        " JOIN events e ON e.turn_id = t.id AND e.type = 'turn.started'"
        " WHERE t.id = $1::uuid",
        first["turn"]["id"],
    )
    assert row["history"] == effective.value
    assert row["fingerprint"] == fingerprint(
        input="hi", history=effective, multitask=Multitask(policy_used)
    )
    started = json.loads(row["data"])
    assert started == {"idempotencyKey": "k", "history": effective.value, "seq": 1} | (
        {"multitask": policy_used} if policy_used == "REJECT" else {}
    )
    spelled = payload | {"history": effective.value, "multitask": policy_used}
    again = (await client.execute(MUTATION, {"input": spelled}))["submitTurn"]
    assert again["__typename"] == "TurnReplayed" and again["turn"]["id"] == first["turn"]["id"]
    assert (await counts(db, sid))[0] == 1


MUTATION = """
mutation($input: SubmitTurnInput!) {
  submitTurn(input: $input) { __typename ... on TurnAdmission { turn { id } } }
}
"""


@pytest.mark.parametrize(
    "changed",
    [
        "hello ",  # trailing space
        "Hello",  # case
        "he\u0301llo",  # a combining accent: no normalisation
        "hello\n",
    ],
)
async def test_changed_input_under_the_same_key_is_a_conflict_and_writes_nothing(
    client: GraphQLClient, db: Any, changed: str
) -> None:
    sid = await client.create_session()
    first = await client.submit(sid, "k", "hello")
    await client.wait_for_status(first["turn"]["id"], {"COMPLETED"})
    before = await counts(db, sid)
    result = await client.submit(sid, "k", changed)
    assert result["__typename"] == "IdempotencyConflict"
    assert result["code"] == "IDEMPOTENCY_CONFLICT"
    assert result["idempotencyKey"] == "k"
    assert result["existingTurnId"] == first["turn"]["id"]
    assert await counts(db, sid) == before


async def test_a_new_key_with_identical_words_is_a_new_turn(client: GraphQLClient) -> None:
    sid = await client.create_session()
    a = await client.submit(sid, "k1", "same words")
    b = await client.submit(sid, "k2", "same words")
    assert a["__typename"] == b["__typename"] == "TurnAccepted"
    assert a["turn"]["id"] != b["turn"]["id"]


async def test_a_key_belongs_to_its_session(client: GraphQLClient) -> None:
    s1, s2 = await client.create_session(), await client.create_session()
    a = await client.submit(s1, "shared", "x")
    b = await client.submit(s2, "shared", "y")  # different input: still no conflict
    assert a["__typename"] == b["__typename"] == "TurnAccepted"
    assert a["turn"]["id"] != b["turn"]["id"]


async def test_200_concurrent_same_key_submissions_make_one_turn(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    results = await asyncio.gather(*(client.submit(sid, "race", "one turn") for _ in range(200)))
    ids = {r["turn"]["id"] for r in results}
    kinds = [r["__typename"] for r in results]
    assert len(ids) == 1
    assert kinds.count("TurnAccepted") == 1
    assert kinds.count("TurnReplayed") == 199
    turns, started, _ = await counts(db, sid)
    assert (turns, started) == (1, 1)


async def test_concurrent_same_key_different_inputs_one_wins_the_rest_conflict(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    inputs = ["a", "b"] * 50
    results = await asyncio.gather(*(client.submit(sid, "race", i) for i in inputs))
    winner = next(r for r in results if r["__typename"] == "TurnAccepted")
    win_input = winner["turn"]["input"]
    for inp, r in zip(inputs, results, strict=True):
        if inp == win_input:
            assert r["__typename"] in {"TurnAccepted", "TurnReplayed"}
            assert r["turn"]["id"] == winner["turn"]["id"]
        else:
            assert r["__typename"] == "IdempotencyConflict"
            assert r["existingTurnId"] == winner["turn"]["id"]
    assert (await counts(db, sid))[:2] == (1, 1)


@pytest.mark.parametrize(
    ("field", "payload"),
    [
        ("idempotencyKey", {"idempotencyKey": ""}),
        ("idempotencyKey", {"idempotencyKey": "k" * 256}),
        ("idempotencyKey", {"idempotencyKey": "bad\nkey"}),
        ("idempotencyKey", {"idempotencyKey": "bad\x00key"}),
        ("idempotencyKey", {"idempotencyKey": "tab\tkey"}),
        ("input", {"input": ""}),
        ("input", {"input": "x" * (64 * 1024 + 1)}),
        ("input", {"input": "é" * (32 * 1024 + 1)}),  # 64 KiB + 2 bytes of UTF-8
        ("input", {"input": "nul\x00inside"}),
        ("sessionId", {"sessionId": "not-a-uuid"}),
    ],
)
async def test_bad_input_gets_a_typed_answer_and_writes_nothing(
    client: GraphQLClient, db: Any, field: str, payload: dict[str, str]
) -> None:
    sid = await client.create_session()
    request = {"sessionId": sid, "idempotencyKey": "k", "input": "fine"}
    request.update(payload)
    data = await client.execute(
        "mutation($i: SubmitTurnInput!) { submitTurn(input: $i) { __typename "
        "... on InvalidInput { code field message } } }",
        {"i": request},
    )
    result = data["submitTurn"]
    assert result["__typename"] == "InvalidInput"
    assert result["code"] == "INVALID_INPUT"
    assert result["field"] == field
    assert field in result["message"]
    assert await db.fetchval("SELECT count(*) FROM turns") == 0
    assert await db.fetchval("SELECT count(*) FROM events") == 0


async def test_limits_are_inclusive(client: GraphQLClient) -> None:
    sid = await client.create_session()
    ok_key = await client.submit(sid, "k" * 255, "fine")
    ok_input = await client.submit(sid, new_key(), "x" * (64 * 1024))
    assert ok_key["__typename"] == ok_input["__typename"] == "TurnAccepted"


async def test_unknown_session_is_session_not_found_and_writes_nothing(
    client: GraphQLClient, db: Any
) -> None:
    missing = "00000000-0000-4000-8000-000000000000"
    result = await client.submit(missing, "k", "hello")
    assert result["__typename"] == "SessionNotFound"
    assert result["code"] == "SESSION_NOT_FOUND"
    assert result["sessionId"] == missing
    assert await db.fetchval("SELECT count(*) FROM turns") == 0


async def test_lookups_of_unknown_or_malformed_ids_return_null(client: GraphQLClient) -> None:
    data = await client.execute(
        """{ a: session(id: "00000000-0000-4000-8000-000000000000") { id }
             b: session(id: "nope") { id }
             c: turn(id: "00000000-0000-4000-8000-000000000000") { id }
             d: turn(id: "nope") { id } }"""
    )
    assert data == {"a": None, "b": None, "c": None, "d": None}
