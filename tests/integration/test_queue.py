"""One turn at a time per session, in admission order; history; the fixture model."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support import GraphQLClient


async def events_of(db: Any, sid: str) -> list[tuple[str, str]]:
    rows = await db.fetch(
        "SELECT type, turn_id FROM events WHERE session_id = $1::uuid ORDER BY seq", sid
    )
    return [(r["type"], str(r["turn_id"])) for r in rows]


async def test_turns_of_a_session_queue_and_run_one_at_a_time_in_admission_order(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    a = await client.submit(sid, "a", "/sleep 600 first")
    b = await client.submit(sid, "b", "second")
    c = await client.submit(sid, "c", "third")
    assert b["turn"]["status"] == "QUEUED" and c["turn"]["status"] == "QUEUED"
    ids = [a["turn"]["id"], b["turn"]["id"], c["turn"]["id"]]
    for tid in ids:
        await client.wait_for_status(tid, {"COMPLETED"})
    runs = [(t, tid) for t, tid in await events_of(db, sid) if t != "turn.started"]
    # running, delta, completed, never interleaved, in admission order
    assert runs == [
        (kind, tid) for tid in ids for kind in ("turn.running", "turn.delta", "turn.completed")
    ]


async def test_full_history_sees_earlier_completed_turns_none_sees_only_its_input(
    client: GraphQLClient,
) -> None:
    sid = await client.create_session("FULL")
    first = await client.submit(sid, "1", "my name is Ada")
    second = await client.submit(sid, "2", "what is my name?")
    third = await client.submit(sid, "3", "what is my name?", history="NONE")
    out1 = (await client.wait_for_status(first["turn"]["id"], {"COMPLETED"}))["output"]
    out2 = (await client.wait_for_status(second["turn"]["id"], {"COMPLETED"}))["output"]
    out3 = (await client.wait_for_status(third["turn"]["id"], {"COMPLETED"}))["output"]
    assert "history: FULL, no earlier turns" in out1
    assert "history: FULL, 1 earlier turn(s)" in out2 and "1. my name is Ada" in out2
    assert out3 == "fixture reply to: what is my name?\nhistory: NONE"


async def test_the_fixture_is_deterministic_across_sessions(client: GraphQLClient) -> None:
    outputs = []
    for _ in range(2):
        sid = await client.create_session()
        ids = [(await client.submit(sid, f"k{n}", f"line {n}"))["turn"]["id"] for n in range(3)]
        outputs.append(
            [(await client.wait_for_status(tid, {"COMPLETED"}))["output"] for tid in ids]
        )
    assert outputs[0] == outputs[1]


async def test_fail_directive_ends_the_turn_with_turn_failed(
    client: GraphQLClient, db: Any
) -> None:
    sid = await client.create_session()
    failed = await client.submit(sid, "f", "/fail")
    after = await client.submit(sid, "g", "still works")
    turn = await client.wait_for_status(failed["turn"]["id"], {"FAILED"})
    assert turn["output"] is None
    assert "fail" in turn["error"]
    assert [e["type"] for e in turn["events"]] == ["turn.started", "turn.running", "turn.failed"]
    ok = await client.wait_for_status(after["turn"]["id"], {"COMPLETED"})
    # a failed turn is not part of FULL history
    assert "history: FULL, no earlier turns" in ok["output"]


async def test_different_sessions_run_at_the_same_time(client: GraphQLClient, db: Any) -> None:
    s1, s2 = await client.create_session(), await client.create_session()
    t1 = await client.submit(s1, "k", "/sleep 1500")
    t2 = await client.submit(s2, "k", "/sleep 1500")
    both_running = False
    for _ in range(100):
        statuses = {
            r["status"]
            for r in await db.fetch(
                "SELECT status FROM turns WHERE id = ANY($1::uuid[])",
                [t1["turn"]["id"], t2["turn"]["id"]],
            )
        }
        if statuses == {"RUNNING"}:
            rows = await db.fetchval("SELECT count(*) FROM turns WHERE status = 'RUNNING'")
            both_running = rows == 2
            break
        await asyncio.sleep(0.05)
    assert both_running
    await client.wait_for_status(t1["turn"]["id"], {"COMPLETED"})
    await client.wait_for_status(t2["turn"]["id"], {"COMPLETED"})
