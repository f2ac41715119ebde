"""Nested lists load in batches: a page of sessions with their turns, and the
turns with their events and tool calls, costs a handful of statements, not
one per row, and answers exactly what asking for each session on its own does."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from keyturn.db import reads as db_reads
from keyturn.db import sql
from keyturn.db.engine import connect, create_engine
from keyturn.runtime.ledger import tool_calls
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
        # one for all the turns' pages of events, one for all their tool
        # events (what their tool calls are made of).
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
        "endCursor } edges { cursor node { input events(first: 20) { seq } } } }"
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


EVENT_FIELDS = (
    "totalCount pageInfo { hasNextPage hasPreviousPage startCursor endCursor } "
    "edges { cursor node { id seq type turnId data } }"
)


async def test_a_page_of_sessions_with_their_events_is_a_few_statements(
    quiet_server: InProcessServer, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await arrange(db, 49, 2)
    await arrange(db, 1, 0)  # a session with no events
    client = GraphQLClient(quiet_server.url)
    try:
        page_query = (
            "{ sessions(first: 50) { edges { node { id "
            f"events(first: 5) {{ {EVENT_FIELDS} }} }} }} }} }}"
        )
        with counting_statements(monkeypatch) as seen:
            page = await client.execute(page_query)
        # The sessions, and one statement for all their pages of events (it
        # was one per session), besides the server's check for tokens.
        reads = [text for text in seen if "api_tokens" not in text]
        assert len(reads) == 2, seen

        sessions = [e["node"] for e in page["sessions"]["edges"]]
        assert len(sessions) == 50
        for s in sessions:
            alone = await client.execute(
                "query($id: ID!) { session(id: $id) { id "
                f"events(first: 5) {{ {EVENT_FIELDS} }} }} }}",
                {"id": s["id"]},
            )
            assert alone["session"] == s
        full = [s for s in sessions if s["id"] in ids]
        assert all(len(s["events"]["edges"]) == 5 for s in full)
        assert all(s["events"]["totalCount"] == 8 for s in full)
        assert all(s["events"]["pageInfo"]["hasNextPage"] for s in full)
        [empty] = [s for s in sessions if s["id"] not in ids]
        assert empty["events"]["edges"] == [] and empty["events"]["totalCount"] == 0
    finally:
        await client.close()


@pytest.mark.parametrize(
    "window",
    ["first: 3", "last: 3", "first: 0", "last: 100", "first: 5, after: $c", "last: 2, before: $c"],
)
async def test_batched_event_pages_keep_first_after_last_before(
    server: InProcessServer, client: GraphQLClient, db: Any, window: str
) -> None:
    ids = await arrange(db, 3, 2)
    await arrange(db, 1, 0)
    fourth = await client.execute(
        "query($id: ID!) { session(id: $id) { events(first: 4) { pageInfo { endCursor } } } }",
        {"id": ids[0]},
    )
    variables = {"c": fourth["session"]["events"]["pageInfo"]["endCursor"]}
    declared = "$c: String" if "$c" in window else ""
    fields = f"events({window}) {{ {EVENT_FIELDS} }}"
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
    full = next(s for s in sessions if s["id"] == ids[0])
    expected = {
        "first: 3": [1, 2, 3],
        "last: 3": [6, 7, 8],
        "first: 0": [],
        "last: 100": list(range(1, 9)),
        "first: 5, after: $c": [5, 6, 7, 8],
        "last: 2, before: $c": [2, 3],
    }[window]
    assert [e["node"]["seq"] for e in full["events"]["edges"]] == expected


NODE_FIELDS = (
    "__typename id ... on Session { eventCount } ... on Turn { status input } "
    "... on Event { seq type data }"
)


async def test_nodes_reads_each_kind_of_id_in_one_statement(
    quiet_server: InProcessServer, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = await arrange(db, 10, 2)
    turns = [str(r["id"]) for r in await db.fetch("SELECT id FROM turns ORDER BY admit_seq")]
    events = [str(r["id"]) for r in await db.fetch("SELECT id FROM events ORDER BY id")]
    # Another tenant's session, turn and event read as null.
    foreign = uuid.uuid4()
    await db.execute(
        "INSERT INTO sessions (id, tenant, default_history, event_seq) "
        "VALUES ($1, 'someone else', 'FULL', 1)",
        foreign,
    )
    foreign_turn = uuid.uuid4()
    await db.execute(
        "INSERT INTO turns (id, session_id, idempotency_key, input, history, fingerprint, status,"
        " admit_seq) VALUES ($1, $2, 'k', 'theirs', 'FULL', 'f', 'COMPLETED', 1)",
        foreign_turn,
        foreign,
    )
    foreign_event = await db.fetchval(
        "INSERT INTO events (session_id, turn_id, seq, type, data) "
        "VALUES ($1, $2, 1, 'turn.started', '{}') RETURNING id",
        foreign,
        foreign_turn,
    )
    unknown = [str(uuid.uuid4()), "not-an-id", "0", "99999999999999999999999", "9223372036854775"]
    others = [str(foreign), str(foreign_turn), str(foreign_event)]
    ids = (sessions + turns[:20] + events[:50] + unknown + others + [sessions[0], events[0]])[:100]
    ids.reverse()  # not the order they were written in
    assert len(ids) == 90
    client = GraphQLClient(quiet_server.url)
    try:
        with counting_statements(monkeypatch) as seen:
            body = await client.execute(
                f"query($ids: [ID!]!) {{ nodes(ids: $ids) {{ {NODE_FIELDS} }} }}", {"ids": ids}
            )
        # Sessions, turns, events: one statement each (it was one or two per
        # id), besides the server's check whether it has tokens at all.
        reads = [text for text in seen if "api_tokens" not in text]
        assert len(reads) == 3, seen
        answers = body["nodes"]
        assert len(answers) == len(ids)
        for id_, answer in zip(ids, answers, strict=True):
            alone = await client.execute(
                f"query($id: ID!) {{ node(id: $id) {{ {NODE_FIELDS} }} }}", {"id": id_}
            )
            assert alone["node"] == answer, id_
            assert (answer is None) == (id_ in unknown + others), id_
            if answer is not None:
                assert answer["id"] == id_
        kinds = [a["__typename"] for a in answers if a is not None]
        assert kinds.count("Session") == 11 and kinds.count("Turn") == 20
        assert kinds.count("Event") == 51
    finally:
        await client.close()


@contextlib.contextmanager
def event_rows_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The type of every event row a statement of the server (in this test's
    process) hands back to it."""
    types: list[str] = []
    original = sql.Statement.fetch

    async def fetch(self: sql.Statement, conn: Any, **params: Any) -> list[Any]:
        rows: list[Any] = await original(self, conn, **params)
        if " FROM events " in self.text:
            types.extend(str(dict(row).get("type")) for row in rows)
        return rows

    monkeypatch.setattr(sql.Statement, "fetch", fetch)
    try:
        yield types
    finally:
        monkeypatch.undo()


TOOL_CALL_FIELDS = "index tool arguments effectKey kind state result reusedFrom"


def expected_calls(events: list[Any]) -> list[dict[str, Any]]:
    """What the tool ledger makes of every event of a turn, as the API shows it."""
    return [
        {
            "index": c.index,
            "tool": c.tool,
            "arguments": c.arguments,
            "effectKey": c.effect_key,
            "kind": c.kind.value,
            "state": c.state.value,
            "result": c.result,
            "reusedFrom": c.reused_from,
        }
        for c in tool_calls(events)
    ]


async def test_tool_calls_of_streamed_turns_read_their_tool_events_not_their_deltas(
    database_url: str, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A delta as soon as 1 ms has passed: each piece of the stream (10 ms
    # apart) is a turn.delta of its own, or nearly. 60 pieces keep each turn
    # under the 100 events wait_for_status reads unpaged.
    settings = fast_settings(delta_flush_ms=1)
    engine = create_engine(database_url, pool_size=2)
    async with serve_in_process(database_url, settings) as srv:
        client = GraphQLClient(srv.url)
        try:
            sid = await client.create_session()
            turn_ids = []
            for n in range(3):
                text = f"/stream 60 10 /write a{n}=1 /read a{n} /append b{n}=2"
                submitted = await client.submit(sid, f"k{n}", text)
                turn_ids.append(submitted["turn"]["id"])
            for tid in turn_ids:
                await client.wait_for_status(tid, {"COMPLETED"}, within=60)
            deltas = await db.fetchval(
                "SELECT count(*) FROM events WHERE session_id = $1::uuid AND type = 'turn.delta'",
                sid,
            )
            assert deltas >= 30, deltas  # the pieces the tool calls must not read

            tools_only = (
                "query($id: ID!) { session(id: $id) { turns(first: 100) { edges { node { "
                f"id toolCalls {{ {TOOL_CALL_FIELDS} }} }} }} }} }} }}"
            )
            with event_rows_read(monkeypatch) as types:
                page = await client.execute(tools_only, {"id": sid})
            assert types, "the tool calls were read from no statement seen here"
            assert all(t.startswith("tool.") for t in types), sorted(set(types))

            # What the ledger makes of all of each turn's events: the answer
            # is the same as when every event was read.
            async with connect(engine) as conn:
                every = {
                    uuid.UUID(t): await db_reads.turn_events(conn, turn_id=uuid.UUID(t))
                    for t in turn_ids
                }
            answers = {
                e["node"]["id"]: e["node"]["toolCalls"] for e in page["session"]["turns"]["edges"]
            }
            assert set(answers) == set(turn_ids)
            for tid in turn_ids:
                assert answers[tid] == expected_calls(every[uuid.UUID(tid)]), tid
                assert [(c["tool"], c["state"]) for c in answers[tid]] == [
                    ("synthetic_write", "COMPLETED"),
                    ("synthetic_read", "COMPLETED"),
                    ("synthetic_append", "COMPLETED"),
                ]

            # Asked with a page of each turn's events, each list is still its own.
            both = (
                "query($id: ID!) { session(id: $id) { turns(first: 100) { edges { node { id "
                f"events(first: 30, afterSeq: 0) {{ seq type }} toolCalls {{ {TOOL_CALL_FIELDS} }} "
                "} } } } }"
            )
            page = await client.execute(both, {"id": sid})
            for edge in page["session"]["turns"]["edges"]:
                node = edge["node"]
                events = every[uuid.UUID(node["id"])]
                assert node["toolCalls"] == answers[node["id"]]
                assert node["events"] == [{"seq": e.seq, "type": e.type} for e in events[:30]]
                assert "turn.delta" in {e["type"] for e in node["events"]}
        finally:
            await client.close()
            await engine.dispose()
