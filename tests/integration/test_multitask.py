"""What a busy session does with a second submission: ENQUEUE (wait), REJECT
(SessionBusy, nothing written) or INTERRUPT (cancel what runs, then run),
against a real server and PostgreSQL, concurrent submissions included."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import orjson

from tests.integration.test_cancel import ended, turn
from tests.support import GraphQLClient

SUBMIT = """
mutation($input: SubmitTurnInput!) {
  submitTurn(input: $input) {
    __typename
    ... on TurnAdmission { replayed turn { id status cancelRequested } }
    ... on UserError { code message }
    ... on IdempotencyConflict { existingTurnId }
    ... on SessionBusy { sessionId turnId }
  }
}
"""


async def session(client: GraphQLClient, multitask: str | None = None) -> str:
    if multitask is None:
        data = await client.execute("mutation { createSession { id multitask } }")
        assert data["createSession"]["multitask"] == "ENQUEUE"
    else:
        data = await client.execute(
            "mutation($m: Multitask) { createSession(input: {multitask: $m}) { id multitask } }",
            {"m": multitask},
        )
        assert data["createSession"]["multitask"] == multitask
    return str(data["createSession"]["id"])


async def submit(
    client: GraphQLClient, sid: str, key: str, text: str, multitask: str | None = None
) -> dict[str, Any]:
    payload: dict[str, Any] = {"sessionId": sid, "idempotencyKey": key, "input": text}
    if multitask is not None:
        payload["multitask"] = multitask
    data = await client.execute(SUBMIT, {"input": payload})
    result: dict[str, Any] = data["submitTurn"]
    return result


async def event_count(db: Any, sid: str) -> int:
    return int(await db.fetchval("SELECT count(*) FROM events WHERE session_id = $1::uuid", sid))


async def test_enqueue_is_the_default_and_waits(client: GraphQLClient) -> None:
    sid = await session(client)
    first = await submit(client, sid, "a", "/sleep 500")
    second = await submit(client, sid, "b", "second")
    assert (first["__typename"], second["__typename"]) == ("TurnAccepted", "TurnAccepted")
    assert second["turn"]["status"] == "QUEUED"
    assert (await ended(client, second["turn"]["id"]))["status"] == "COMPLETED"
    assert (await ended(client, first["turn"]["id"]))["status"] == "COMPLETED"


async def test_reject_answers_session_busy_writes_nothing_and_admits_the_key_once_idle(
    client: GraphQLClient, db: Any
) -> None:
    sid = await session(client, "REJECT")
    first = (await submit(client, sid, "a", "/sleep 1000"))["turn"]["id"]
    # Counted once it runs: it writes nothing more until it ends.
    await client.wait_for_status(first, {"RUNNING"})
    before = await event_count(db, sid)
    busy = await submit(client, sid, "b", "second")
    assert busy["__typename"] == "SessionBusy", busy
    assert (busy["code"], busy["turnId"], busy["sessionId"]) == ("SESSION_BUSY", first, sid)
    assert await event_count(db, sid) == before
    assert await db.fetchval("SELECT count(*) FROM turns WHERE session_id = $1::uuid", sid) == 1
    # An ENQUEUE submission in the same session waits instead.
    queued = await submit(client, sid, "c", "queued", multitask="ENQUEUE")
    assert queued["__typename"] == "TurnAccepted"
    await ended(client, queued["turn"]["id"])
    # Idle now: the same key is a new admission, not a replay of the refusal.
    again = await submit(client, sid, "b", "second")
    assert again["__typename"] == "TurnAccepted", again
    assert (await ended(client, again["turn"]["id"]))["status"] == "COMPLETED"
    # And from now on the key replays, whatever the session does.
    busy_again = await submit(client, sid, "d", "/sleep 500")
    replay = await submit(client, sid, "b", "second")
    assert replay["__typename"] == "TurnReplayed"
    await ended(client, busy_again["turn"]["id"])


async def test_concurrent_reject_submissions_admit_exactly_one(client: GraphQLClient) -> None:
    sid = await session(client, "REJECT")
    answers = await asyncio.gather(
        *(submit(client, sid, f"k{n}", f"/sleep 300 {n}") for n in range(10))
    )
    accepted = [a for a in answers if a["__typename"] == "TurnAccepted"]
    busy = [a for a in answers if a["__typename"] == "SessionBusy"]
    assert len(accepted) == 1, answers
    assert len(busy) == 9
    assert {b["turnId"] for b in busy} == {accepted[0]["turn"]["id"]}


async def test_the_policy_is_part_of_the_request_a_key_names(client: GraphQLClient) -> None:
    sid = await session(client)
    first = await submit(client, sid, "a", "hello")
    # Leaving it out is the same request as the session's setting.
    same = await submit(client, sid, "a", "hello", multitask="ENQUEUE")
    assert same["__typename"] == "TurnReplayed"
    other = await submit(client, sid, "a", "hello", multitask="REJECT")
    assert other["__typename"] == "IdempotencyConflict"
    assert other["existingTurnId"] == first["turn"]["id"]


async def test_interrupt_cancels_what_runs_and_what_waits_then_runs_with_history_showing_it(
    client: GraphQLClient,
) -> None:
    sid = await session(client)
    running = (await submit(client, sid, "a", "/stream 20 200"))["turn"]["id"]
    queued = (await submit(client, sid, "b", "queued"))["turn"]["id"]
    deadline = asyncio.get_running_loop().time() + 10
    while (await turn(client, running))["status"] != "RUNNING":
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    new = await submit(client, sid, "c", "now this", multitask="INTERRUPT")
    assert new["__typename"] == "TurnAccepted"
    new_id = new["turn"]["id"]
    done = await ended(client, new_id)
    assert done["status"] == "COMPLETED"
    stopped = await turn(client, running)
    assert stopped["status"] == "CANCELLED"
    assert new_id in stopped["cancelReason"]
    requested = [e for e in stopped["events"] if e["type"] == "turn.cancel_requested"]
    assert len(requested) == 1 and new_id in requested[0]["data"]["reason"]
    skipped = await turn(client, queued)
    assert skipped["status"] == "CANCELLED"
    assert new_id in skipped["cancelReason"]
    # The new turn's history shows both, marked.
    assert "/stream 20 200 [cancelled]" in done["output"]
    assert "queued [cancelled]" in done["output"]
    # A replay never triggers the policy again.
    busy = (await submit(client, sid, "d", "/sleep 600"))["turn"]["id"]
    replay = await submit(client, sid, "c", "now this", multitask="INTERRUPT")
    assert replay["__typename"] == "TurnReplayed"
    t = await ended(client, busy)
    assert t["status"] == "COMPLETED"
    assert t["cancelRequested"] is False


async def test_interrupt_as_the_sessions_setting_and_concurrent_interrupts(
    client: GraphQLClient, db: Any
) -> None:
    sid = await session(client, "INTERRUPT")
    first = (await submit(client, sid, "a", "/sleep 2000"))["turn"]["id"]
    answers = await asyncio.gather(*(submit(client, sid, f"k{n}", f"n{n}") for n in range(5)))
    assert all(a["__typename"] == "TurnAccepted" for a in answers), answers
    ends = {a["turn"]["id"]: await ended(client, a["turn"]["id"]) for a in answers}
    assert (await ended(client, first))["status"] == "CANCELLED"
    # The order of admission is the order of the turns' turn.started events.
    rows = await db.fetch(
        "SELECT seq, type, turn_id::text AS turn_id, data FROM events"
        " WHERE session_id = $1::uuid ORDER BY seq",
        sid,
    )
    started = [r["turn_id"] for r in rows if r["type"] == "turn.started"]
    assert started[0] == first and set(started[1:]) == set(ends)
    start_seq = {r["turn_id"]: r["seq"] for r in rows if r["type"] == "turn.started"}
    end_types = {"turn.completed", "turn.cancelled", "turn.failed", "turn.interrupted"}
    end_seq: dict[str, int] = {}
    for r in rows:
        if r["type"] in end_types:
            assert r["turn_id"] not in end_seq, f"{r['turn_id']} ended twice"
            end_seq[r["turn_id"]] = r["seq"]
    # The last one admitted is interrupted by nobody: it completes.
    last = started[-1]
    assert ends[last]["status"] == "COMPLETED" and ends[last]["cancelRequested"] is False
    # Each interrupts all before it. A turn still queued when a later one was
    # admitted ends CANCELLED there and then; a running one is asked to stop,
    # and that request and its own end race fairly (it may complete). Only a
    # turn that had ended before the next admission has no cancel at all.
    for earlier, later in itertools.pairwise(started):
        events = [r for r in rows if r["turn_id"] == earlier]
        types = [r["type"] for r in events]
        if end_seq[earlier] < start_seq[later]:
            assert "turn.cancel_requested" not in types, types
            continue
        t = ends.get(earlier) or await turn(client, earlier)
        assert t["cancelRequested"] is True, t
        interrupter = t["cancelReason"].removeprefix("interrupted by turn ").split(" ")[0]
        assert start_seq[interrupter] > start_seq[earlier], t["cancelReason"]
        if "turn.cancel_requested" not in types:
            assert t["status"] == "CANCELLED", (t["status"], types)
            cancelled = next(r for r in events if r["type"] == "turn.cancelled")
            assert orjson.loads(cancelled["data"])["was"] == "QUEUED"
        else:
            assert t["status"] in {"CANCELLED", "COMPLETED"}, (t["status"], types)
