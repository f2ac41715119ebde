"""Event order: per-session seq 1, 2, 3 … gapless and in commit order; paging; the demo."""

from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any

import pytest

from keyturn.db import reads
from tests.support import GraphQLClient, admin


async def test_seq_is_gapless_per_session_under_concurrent_writers(
    client: GraphQLClient, db: Any
) -> None:
    sessions = [await client.create_session() for _ in range(4)]
    await asyncio.gather(
        *(client.submit(sid, f"k{n}", f"turn {n}") for sid in sessions for n in range(15))
    )
    for sid in sessions:
        turns = await db.fetch("SELECT id FROM turns WHERE session_id = $1::uuid", sid)
        for t in turns:
            await client.wait_for_status(str(t["id"]), {"COMPLETED"})
        seqs = [
            r["seq"]
            for r in await db.fetch(
                "SELECT seq FROM events WHERE session_id = $1::uuid ORDER BY seq", sid
            )
        ]
        # 15 turns, each: started, running, its one delta, completed
        assert seqs == list(range(1, 61))
        session = await client.session(sid)
        assert session["eventCount"] == 60


async def test_a_reader_never_finds_a_new_event_at_or_below_a_seq_it_has_seen(
    client: GraphQLClient, db: Any, database_url: str
) -> None:
    sid = await client.create_session()
    reader_conn = await admin(database_url)
    seen: set[int] = set()
    high = 0
    violations: list[tuple[int, int]] = []
    stop = asyncio.Event()

    async def reader() -> None:
        nonlocal high
        while not stop.is_set():
            rows = await reader_conn.fetch(
                "SELECT seq FROM events WHERE session_id = $1::uuid ORDER BY seq", sid
            )
            now = {r["seq"] for r in rows}
            for seq in now - seen:
                if seq <= high:
                    violations.append((seq, high))
            seen.update(now)
            high = max(seen, default=0)

    task = asyncio.create_task(reader())
    await asyncio.gather(*(client.submit(sid, f"k{n}", "x") for n in range(60)))
    turns = await db.fetch("SELECT id FROM turns WHERE session_id = $1::uuid", sid)
    for t in turns:
        await client.wait_for_status(str(t["id"]), {"COMPLETED"})
    stop.set()
    await task
    await reader_conn.close()
    assert violations == []
    assert seen == set(range(1, 241))  # 60 turns of 4 events


async def test_events_page_with_opaque_cursors(client: GraphQLClient) -> None:
    sid = await client.create_session()
    for n in range(5):
        r = await client.submit(sid, f"k{n}", "x")
        await client.wait_for_status(r["turn"]["id"], {"COMPLETED"})
    query = """query($id: ID!, $after: String) { session(id: $id) {
        events(first: 4, after: $after) {
          totalCount pageInfo { hasNextPage endCursor } edges { cursor node { seq } } } } }"""
    after = None
    collected: list[int] = []
    pages = 0
    while True:
        data = await client.execute(query, {"id": sid, "after": after})
        conn = data["session"]["events"]
        assert conn["totalCount"] == 20
        collected += [e["node"]["seq"] for e in conn["edges"]]
        pages += 1
        if not conn["pageInfo"]["hasNextPage"]:
            break
        after = conn["pageInfo"]["endCursor"]
        assert after == conn["edges"][-1]["cursor"]
    assert collected == list(range(1, 21))
    assert pages == 5


def _cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"event:{seq}".encode()).decode().rstrip("=")


PAGE = """totalCount pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    edges { cursor node { id seq type turnId sessionId data } }"""
# Selections of a page, and whether the page may be read without its
# events' ids and time (only seq, type and data, no fragment on the way).
SELECTIONS = [
    (PAGE, False),
    ("edges { cursor node { seq type data } }", True),
    (
        "__typename totalCount pageInfo { endCursor } edges { __typename node { __typename seq } }",
        True,
    ),
    ("edges { cursor node { s: seq t: type d: data createdAt } }", False),
    ("edges { node { seq } } more: edges { node { turnId } }", False),
    ("edges { node { seq ... on Event { id } } }", False),
    ("edges { node { seq ...Ids } }", False),
    ("edges { ... on EventEdge { node { createdAt } } node { seq } }", False),
    ("... on EventConnection { edges { node { sessionId } } }", False),
    ("edges { node { seq data turnId @include(if: true) } }", False),
]
FRAGMENTS = "fragment Ids on Event { id turnId sessionId createdAt }"


async def test_a_page_read_with_its_session_answers_as_one_read_on_its_own(
    client: GraphQLClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``session(id:) { events(…) }`` reads the session and its page in one
    statement; in a fragment the page is read on its own, after the session.
    Both answer the same, for every window, valid or not, and for every
    selection, whether it was read lean (without the events' ids and time)
    or not."""
    sid = await client.create_session()
    for n in range(5):
        r = await client.submit(sid, f"k{n}", "x")
        await client.wait_for_status(r["turn"]["id"], {"COMPLETED"})
    together: list[str] = []
    leanly: list[bool] = []
    real = reads.session_with_events

    async def counted(*args: Any, **kwargs: Any) -> Any:
        together.append(kwargs["session_id"])
        leanly.append(kwargs.get("lean", False))
        return await real(*args, **kwargs)

    monkeypatch.setattr(reads, "session_with_events", counted)
    windows = [
        "",
        "first: 4",
        f'first: 4, after: "{_cursor(8)}"',
        "first: 0",
        f'first: 100, after: "{_cursor(20)}"',
        f'after: "{_cursor(999)}"',
        "last: 3",
        f'last: 3, before: "{_cursor(10)}"',
        'after: "garbage!"',
        "first: 101",
        "first: -1",
        "first: 2, last: 2",
    ]
    for window in windows:
        args = f"({window})" if window else ""
        direct = await client.raw(
            f"query($id: ID!) {{ session(id: $id) {{ eventCount events{args} {{ {PAGE} }} }} }}",
            {"id": sid},
        )
        apart = await client.raw(
            f"query($id: ID!) {{ session(id: $id) {{ eventCount "
            f"... on Session {{ events{args} {{ {PAGE} }} }} }} }}",
            {"id": sid},
        )
        # The same, but where in its document each error's field stands.
        for body in (direct, apart):
            for error in body.get("errors", []):
                error.pop("locations")
        assert direct == apart, window
    # Forward windows (the valid ones) were read with the session; the rest on their own.
    assert len(together) == 6
    for selection, lean in SELECTIONS:
        for window in ("", f'first: 4, after: "{_cursor(8)}"'):
            args = f"({window})" if window else ""
            uses = FRAGMENTS if "...Ids" in selection else ""
            leanly.clear()
            direct = await client.raw(
                f"query($id: ID!) {{ session(id: $id) {{ events{args} {{ {selection} }} }} }} "
                + uses,
                {"id": sid},
            )
            assert leanly == [lean], selection
            apart = await client.raw(
                f"query($id: ID!) {{ session(id: $id) {{ "
                f"... on Session {{ events{args} {{ {selection} }} }} }} }} " + uses,
                {"id": sid},
            )
            assert "errors" not in direct, direct
            assert direct == apart, selection
    # A fragment beside the page may select it again: graphql-core merges
    # the two into one field, whose answer reads the events' ids.
    merged = "events { edges { node { seq } } } ... on Session { events { edges { node { id } } } }"
    leanly.clear()
    direct = await client.raw(f"query($id: ID!) {{ session(id: $id) {{ {merged} }} }}", {"id": sid})
    assert leanly == [False]
    apart = await client.raw(
        f"query($id: ID!) {{ session(id: $id) {{ ... on Session {{ {merged} }} }} }}", {"id": sid}
    )
    assert direct == apart
    assert all(e["node"]["id"] for e in direct["data"]["session"]["events"]["edges"]), direct
    together.clear()
    # With variables too, and for a session that is not there.
    query = f"""query($id: ID!, $first: Int, $after: String) {{ session(id: $id) {{
        events(first: $first, after: $after) {{ {PAGE} }} }} }}"""
    page = await client.execute(query, {"id": sid, "first": 3, "after": _cursor(17)})
    assert [e["node"]["seq"] for e in page["session"]["events"]["edges"]] == [18, 19, 20]
    assert not page["session"]["events"]["pageInfo"]["hasNextPage"]
    gone = await client.execute(query, {"id": str(uuid.uuid4()), "first": 3, "after": None})
    assert gone == {"session": None}
    assert len(together) == 2


async def test_first_over_100_is_an_error_not_a_clamp(client: GraphQLClient) -> None:
    sid = await client.create_session()
    for field in ("events", "turns"):
        body = await client.raw(
            f"query($id: ID!) {{ session(id: $id) {{ {field}(first: 101) {{ totalCount }} }} }}",
            {"id": sid},
        )
        assert body["data"] is None or body["data"]["session"] is None
        error = body["errors"][0]
        assert "at most 100" in error["message"]
        assert error["extensions"]["code"] == "BAD_USER_INPUT"
    body = await client.raw("{ sessions(first: 1000) { totalCount } }")
    assert "at most 100" in body["errors"][0]["message"]
    body = await client.raw(
        'query($id: ID!) { session(id: $id) { events(after: "garbage!") { totalCount } } }',
        {"id": sid},
    )
    assert "cursor" in body["errors"][0]["message"]


async def test_sessions_list_pages(client: GraphQLClient) -> None:
    made = [await client.create_session() for _ in range(3)]
    data = await client.execute(
        "{ sessions(first: 2) { totalCount pageInfo { hasNextPage endCursor } "
        "edges { node { id defaultHistory eventCount } } } }"
    )
    first = data["sessions"]
    assert first["totalCount"] == 3 and first["pageInfo"]["hasNextPage"] is True
    data = await client.execute(
        "query($a: String) { sessions(first: 2, after: $a) { pageInfo { hasNextPage } "
        "edges { node { id } } } }",
        {"a": first["pageInfo"]["endCursor"]},
    )
    ids = [e["node"]["id"] for e in first["edges"]] + [
        e["node"]["id"] for e in data["sessions"]["edges"]
    ]
    assert ids == made
    # The count is made only when asked for, however it is asked for.
    for document in (
        "{ sessions(first: 1) { ...Counted } } fragment Counted on SessionConnection "
        "{ totalCount }",
        "{ sessions(first: 1) { ... on SessionConnection { total: totalCount } } }",
    ):
        found = (await client.execute(document))["sessions"]
        assert found.get("totalCount", found.get("total")) == 3, (document, found)
    assert data["sessions"]["pageInfo"]["hasNextPage"] is False


async def test_the_demo_reload_retry_replays_and_event_count_is_unchanged(
    server: Any, db: Any
) -> None:
    """A client submits, loses everything but its last request, reconnects and retries."""
    first_client = GraphQLClient(server.url)
    sid = await first_client.create_session()
    request = (sid, "demo-key", "What is the plan?")
    accepted = await first_client.submit(*request)
    await first_client.wait_for_status(accepted["turn"]["id"], {"COMPLETED"})
    count_before = (await first_client.session(sid))["eventCount"]
    await first_client.close()

    reloaded = GraphQLClient(server.url)  # a new connection, nothing shared
    retried = await reloaded.submit(*request)
    assert retried["__typename"] == "TurnReplayed"
    assert retried["turn"]["id"] == accepted["turn"]["id"]
    assert (await reloaded.session(sid))["eventCount"] == count_before
    await reloaded.close()
