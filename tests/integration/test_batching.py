"""Nested lists load in batches: a page of sessions with their turns, and the
turns with their events and tool calls, costs a handful of statements, not
one per row, and answers exactly what asking for each session on its own does."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process
from tests.support.statements import counting_statements

SESSIONS = 20
TURNS = 20

TURN_FIELDS = "id status input output events { seq type } toolCalls { index tool state }"
PAGE = (
    "{ sessions(first: 20) { edges { node { id "
    "turns(first: 20) { totalCount pageInfo { hasNextPage hasPreviousPage } "
    f"edges {{ cursor node {{ {TURN_FIELDS} }} }} }} }} }} }} }}"
)
ONE = (
    "query($id: ID!) { session(id: $id) { id "
    "turns(first: 20) { totalCount pageInfo { hasNextPage hasPreviousPage } "
    f"edges {{ cursor node {{ {TURN_FIELDS} }} }} }} }} }}"
)


@pytest.fixture
async def quiet_server(database_url: str) -> AsyncIterator[InProcessServer]:
    # No background polling while statements are counted.
    settings = fast_settings(claim_poll_s=600, subscription_poll_s=600, auth_recheck_s=600)
    async with serve_in_process(database_url, settings) as srv:
        yield srv


async def arrange(db: Any, sessions: int, turns: int) -> list[str]:
    """Sessions with completed turns, each with its events and one tool call."""
    ids = []
    for _ in range(sessions):
        sid = uuid.uuid4()
        ids.append(str(sid))
        await db.execute(
            "INSERT INTO sessions (id, default_history, event_seq) VALUES ($1, 'FULL', $2)",
            sid,
            turns * 4,
        )
        seq = 0
        for n in range(turns):
            tid = uuid.uuid4()
            await db.execute(
                "INSERT INTO turns (id, session_id, idempotency_key, input, history, fingerprint,"
                " status, output, admit_seq) VALUES ($1, $2, $3, $4, 'FULL', 'f', 'COMPLETED',"
                " $5, $6)",
                tid,
                sid,
                f"k{n}",
                f"input {n}",
                f"output {n}",
                n + 1,
            )
            call = {"index": 0, "tool": "clock", "arguments": {}, "effectKey": f"e{n}"}
            events = [
                ("turn.started", {}),
                ("tool.planned", {"calls": [call]}),
                ("tool.result", {**call, "result": {"n": n}}),
                ("turn.completed", {"output": f"output {n}"}),
            ]
            for type_, data in events:
                seq += 1
                await db.execute(
                    "INSERT INTO events (session_id, turn_id, seq, type, data)"
                    " VALUES ($1, $2, $3, $4, $5::jsonb)",
                    sid,
                    tid,
                    seq,
                    type_,
                    json.dumps(data),
                )
    return ids


async def test_a_page_of_sessions_with_turns_events_and_tool_calls_is_a_few_statements(
    quiet_server: InProcessServer, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await arrange(db, SESSIONS, TURNS)
    client = GraphQLClient(quiet_server.url)
    try:
        with counting_statements(monkeypatch) as seen:
            page = await client.execute(PAGE)
        # One for the sessions, one for their count, one for all their turns,
        # one for all the turns' events (tool calls come from the same events).
        assert len(seen) <= 6, seen

        sessions = [e["node"] for e in page["sessions"]["edges"]]
        assert sorted(s["id"] for s in sessions) == sorted(ids)
        for s in sessions:
            turns = s["turns"]["edges"]
            assert len(turns) == TURNS
            assert [t["node"]["input"] for t in turns] == [f"input {n}" for n in range(TURNS)]
            assert all(len(t["node"]["events"]) == 4 for t in turns)
            assert all(t["node"]["toolCalls"][0]["state"] == "COMPLETED" for t in turns)
            # The same answer as asking for the session on its own.
            alone = await client.execute(ONE, {"id": s["id"]})
            assert alone["session"] == s
    finally:
        await client.close()


@pytest.mark.parametrize(
    "window",
    ["first: 3", "last: 3", "first: 0", "last: 100", "first: 5, after: $c", "last: 2, before: $c"],
)
async def test_batched_pages_keep_first_after_last_before(
    server: InProcessServer, client: GraphQLClient, db: Any, window: str
) -> None:
    ids = await arrange(db, 3, 7)
    await arrange(db, 1, 0)  # a session with no turns
    fourth = await client.execute(
        "query($id: ID!) { session(id: $id) { turns(first: 4) { pageInfo { endCursor } } } }",
        {"id": ids[0]},
    )
    variables = {"c": fourth["session"]["turns"]["pageInfo"]["endCursor"]}
    declared = "$c: String" if "$c" in window else ""
    fields = (
        f"turns({window}) {{ totalCount pageInfo {{ hasNextPage hasPreviousPage startCursor "
        "endCursor } edges { cursor node { input events { seq } } } }"
    )
    page = await client.execute(
        f"query{f'({declared})' if declared else ''} "
        f"{{ sessions(first: 10) {{ edges {{ node {{ id {fields} }} }} }} }}",
        variables if declared else {},
    )
    sessions = [e["node"] for e in page["sessions"]["edges"]]
    assert len(sessions) == 4
    for s in sessions:
        alone = await client.execute(
            f"query($id: ID!{', ' + declared if declared else ''}) "
            f"{{ session(id: $id) {{ id {fields} }} }}",
            {"id": s["id"], **(variables if declared else {})},
        )
        assert alone["session"] == s
    empty = [s for s in sessions if s["id"] not in ids]
    assert empty[0]["turns"]["totalCount"] == 0 and empty[0]["turns"]["edges"] == []
    full = next(s for s in sessions if s["id"] == ids[0])
    assert full["turns"]["totalCount"] == 7
    expected = {
        "first: 3": ["input 0", "input 1", "input 2"],
        "last: 3": ["input 4", "input 5", "input 6"],
        "first: 0": [],
        "last: 100": [f"input {n}" for n in range(7)],
        "first: 5, after: $c": ["input 4", "input 5", "input 6"],
        "last: 2, before: $c": ["input 1", "input 2"],
    }[window]
    assert [e["node"]["input"] for e in full["turns"]["edges"]] == expected
