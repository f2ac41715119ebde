"""What Relay's store and compiler rely on: every object refetchable by its id
through Query.node, and connections that page both ways."""

from __future__ import annotations

import base64
from typing import Any

from keyturn.runtime.auth import create_token
from tests.support import GraphQLClient, InProcessServer

NODE = """query($id: ID!) { node(id: $id) { __typename id
  ... on Session { eventCount } ... on Turn { status input } ... on Event { seq type } } }"""


async def completed_turns(client: GraphQLClient, sid: str, count: int) -> list[str]:
    ids = []
    for n in range(count):
        turn = (await client.submit(sid, f"k{n}", f"turn {n}"))["turn"]
        await client.wait_for_status(turn["id"], {"COMPLETED"})
        ids.append(turn["id"])
    return ids


async def test_every_object_is_found_again_by_its_id(client: GraphQLClient) -> None:
    sid = await client.create_session()
    [tid] = await completed_turns(client, sid, 1)
    events = (await client.session(sid))["events"]["edges"]
    first_event = await client.execute(
        "query($id: ID!) { session(id: $id) { events(first: 1) { edges { node { id seq } } } } }",
        {"id": sid},
    )
    eid = first_event["session"]["events"]["edges"][0]["node"]["id"]

    session = (await client.execute(NODE, {"id": sid}))["node"]
    assert session == {"__typename": "Session", "id": sid, "eventCount": len(events)}
    turn = (await client.execute(NODE, {"id": tid}))["node"]
    assert turn == {"__typename": "Turn", "id": tid, "status": "COMPLETED", "input": "turn 0"}
    event = (await client.execute(NODE, {"id": eid}))["node"]
    assert event == {"__typename": "Event", "id": eid, "seq": 1, "type": "turn.started"}

    both = await client.execute(
        "query($ids: [ID!]!) { nodes(ids: $ids) { __typename id } }",
        {"ids": [tid, "not-an-id", sid, "99999999999999999999999", "0"]},
    )
    assert both["nodes"] == [
        {"__typename": "Turn", "id": tid},
        None,
        {"__typename": "Session", "id": sid},
        None,
        None,
    ]


async def test_another_tenants_id_reads_as_null(server: InProcessServer) -> None:
    import httpx

    engine = server.app.state.runtime.engine
    alice, bob = (await create_token(engine, name="alice"), await create_token(engine, name="bob"))

    async def ask(token: str, query: str, variables: dict[str, Any]) -> Any:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            answer = await http.post(
                "/graphql",
                json={"query": query, "variables": variables},
                headers={"authorization": f"Bearer {token}"},
            )
        body = answer.json()
        assert not body.get("errors"), body
        return body["data"]

    sid = (await ask(alice, "mutation { createSession { id } }", {}))["createSession"]["id"]
    assert (await ask(alice, NODE, {"id": sid}))["node"]["id"] == sid
    assert (await ask(bob, NODE, {"id": sid}))["node"] is None


LATEST = """query($id: ID!, $last: Int, $before: String) { session(id: $id) {
  turns(last: $last, before: $before) {
    totalCount
    pageInfo { hasPreviousPage hasNextPage startCursor endCursor }
    edges { cursor node { input } } } } }"""


async def test_a_sessions_latest_turns_page_backwards(client: GraphQLClient) -> None:
    sid = await client.create_session()
    await completed_turns(client, sid, 5)
    seen: list[str] = []
    before = None
    pages = 0
    while True:
        data = await client.execute(LATEST, {"id": sid, "last": 2, "before": before})
        conn = data["session"]["turns"]
        assert conn["totalCount"] == 5
        page = [e["node"]["input"] for e in conn["edges"]]
        seen = page + seen
        info = conn["pageInfo"]
        assert info["startCursor"] == conn["edges"][0]["cursor"]
        assert info["endCursor"] == conn["edges"][-1]["cursor"]
        assert info["hasNextPage"] is (before is not None)
        pages += 1
        if not info["hasPreviousPage"]:
            break
        before = info["startCursor"]
    assert seen == [f"turn {n}" for n in range(5)]
    assert pages == 3


async def test_the_latest_events_and_forward_paging_agree(client: GraphQLClient) -> None:
    sid = await client.create_session()
    await completed_turns(client, sid, 2)
    data = await client.execute(
        """query($id: ID!) { session(id: $id) {
             latest: events(last: 2) { pageInfo { hasPreviousPage hasNextPage }
                                       edges { node { seq type } } }
             start: events(first: 2) { pageInfo { hasPreviousPage hasNextPage endCursor } } } }""",
        {"id": sid},
    )
    latest = data["session"]["latest"]
    assert [e["node"] for e in latest["edges"]] == [
        {"seq": 7, "type": "turn.delta"},
        {"seq": 8, "type": "turn.completed"},
    ]
    assert latest["pageInfo"] == {"hasPreviousPage": True, "hasNextPage": False}
    start = data["session"]["start"]["pageInfo"]
    assert (start["hasPreviousPage"], start["hasNextPage"]) == (False, True)
    after = await client.execute(
        "query($id: ID!, $a: String) { session(id: $id) { events(first: 1, after: $a) "
        "{ pageInfo { hasPreviousPage } edges { node { seq } } } } }",
        {"id": sid, "a": start["endCursor"]},
    )
    events = after["session"]["events"]
    assert events["pageInfo"]["hasPreviousPage"] is True
    assert [e["node"]["seq"] for e in events["edges"]] == [3]


async def test_paging_both_ways_at_once_is_refused(client: GraphQLClient) -> None:
    sid = await client.create_session()
    body = await client.raw(
        "query($id: ID!) { session(id: $id) { turns(first: 2, last: 2) { totalCount } } }",
        {"id": sid},
    )
    [error] = body["errors"]
    assert "first/after or backward with last/before" in error["message"]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    body = await client.raw(
        'query($id: ID!) { session(id: $id) { events(last: 2, before: "nope") { totalCount } } }',
        {"id": sid},
    )
    assert body["errors"][0]["message"] == "before is not a cursor this API gave out"
    body = await client.raw(
        "query($id: ID!) { session(id: $id) { events(last: 101) { totalCount } } }", {"id": sid}
    )
    assert "last must be at most 100" in body["errors"][0]["message"]


PAGE_AFTER = (
    "query($id: ID!, $c: String!) { session(id: $id) { events(after: $c) { totalCount } } }"
)


async def test_ids_and_cursors_that_only_look_like_numbers_are_unknown_not_errors(
    client: GraphQLClient,
) -> None:
    # str.isdigit takes "³" and "٣"; int() refuses 5,000 digits. Neither is
    # an event's id or a seq this API gave out: null, or a typed refusal.
    sid = await client.create_session()
    await completed_turns(client, sid, 1)
    looks = ["³", "٣", "9" * 5000, "-1", "1" * 19]
    found = await client.execute(
        "query($ids: [ID!]!) { nodes(ids: $ids) { __typename } }", {"ids": looks}
    )
    assert found["nodes"] == [None] * len(looks)
    for one in looks:
        assert (await client.execute(NODE, {"id": one}))["node"] is None
    for value in ("³", "٣", "9" * 5000, "9" * 19):
        cursor = base64.urlsafe_b64encode(f"event:{value}".encode()).decode()
        body = await client.raw(PAGE_AFTER, {"id": sid, "c": cursor})
        [error] = body["errors"]
        assert error["message"] == "after is not a cursor this API gave out", error
        assert error["extensions"]["code"] == "BAD_USER_INPUT"
