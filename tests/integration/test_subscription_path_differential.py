"""Subscriptions answer the same frames two ways: through
KeyturnSchema.stream's plain path (the default: build_schema's extensions
done in place, keyturn.schema), and through Strawberry's own ``stream``
with its extension runner (``plain_streams = False``).

One real server on PostgreSQL, in process, so the path can be switched
between two subscriptions; each case below runs both ways over a real
WebSocket (graphql-transport-ws), the order alternating, on the same
record, or on a turn of its own started alike where it must be live.
Compared: every frame (type and payload, with the turn's own id put back
to one name), how the socket closed, and what the unexpected errors put in
the log.

Covered: a turn's end read at once and delivered live; a turn's events
from the record and live; a session's events (the first frames, then the
client completes it); an unknown turn and an id that is not one (refused
by the resolver); variables that do not coerce; validation, depth, alias
and cost refusals; two root fields; a fragment and an operation picked by
name; a query over the socket (Strawberry's path either way); a document
that does not parse or names no operation it holds; and a server without
introspection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from keyturn.ops import databases
from keyturn.resolvers import streams as resolver_streams
from keyturn.schema import KeyturnSchema
from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process

# The server lives in the module's loop: the tests run in it too.
pytestmark = pytest.mark.asyncio(loop_scope="module")

SETTINGS = {
    "open": {"max_query_cost": 2000},
    "closed": {"introspection": False, "max_query_depth": 6, "max_query_cost": 2000},
}

COMPLETED = "subscription($t: ID!) { turnCompleted(turnId: $t) { id status output } }"
TURN_EVENTS = "subscription($t: ID!) { turnEvents(turnId: $t) { seq type turnId } }"


@dataclass
class Served:
    server: InProcessServer
    schema: KeyturnSchema
    client: GraphQLClient
    session: str
    ended: str  # a turn that has ended


async def _ended_turn(client: GraphQLClient, session: str, text: str) -> str:
    turn = str((await client.submit(session, uuid.uuid4().hex, text))["turn"]["id"])
    await client.wait_for_status(turn, {"COMPLETED", "FAILED"})
    return turn


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=sorted(SETTINGS))
async def served(
    request: pytest.FixtureRequest, server_url: str, template_db: str
) -> AsyncIterator[Served]:
    async with (
        databases.throwaway(server_url, prefix="keyturn_t", template=template_db) as url,
        serve_in_process(url, fast_settings(**SETTINGS[request.param])) as server,
    ):
        schema = server.view.schema
        # The comparison is only worth something if the default path is
        # the plain one.
        assert isinstance(schema, KeyturnSchema) and schema.plain is not None
        assert schema.plain_streams
        client = GraphQLClient(server.url)
        try:
            session = await client.create_session()
            ended = await _ended_turn(client, session, "hello")
            yield Served(server, schema, client, session, ended)
        finally:
            await client.close()


@dataclass(frozen=True)
class Case:
    query: str
    variables: dict[str, Any] | None = None
    operation: str | None = None
    # Frames to read before the client completes the operation itself (a
    # stream that never ends); None: read until the server ends it.
    frames: int | None = None
    # Whether the plain path takes it: a subscription that parses and that
    # the document names (the rest take Strawberry's path either way).
    plain: bool = True


async def _frames(ws_url: str, case: Case, own: dict[str, str]) -> tuple[list[Any], Any]:
    """Every frame the server sends for one operation (ids of ``own`` put
    back to their names), and how the socket closed (None: still open)."""
    seen: list[Any] = []
    closed: Any = None
    async with ws_connect(ws_url, subprotocols=[Subprotocol("graphql-transport-ws")]) as ws:
        await ws.send(json.dumps({"type": "connection_init", "payload": {}}))
        assert json.loads(await ws.recv())["type"] == "connection_ack"
        payload: dict[str, Any] = {"query": case.query}
        if case.variables is not None:
            payload["variables"] = case.variables
        if case.operation is not None:
            payload["operationName"] = case.operation
        await ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": payload}))
        try:
            async with asyncio.timeout(30):
                while True:
                    text = str(await ws.recv())
                    for name, value in own.items():
                        text = text.replace(value, name)
                    frame = json.loads(text)
                    if frame["type"] == "ping":
                        await ws.send(json.dumps({"type": "pong"}))
                        continue
                    seen.append(frame)
                    if frame["type"] in ("complete", "error"):
                        break
                    if case.frames is not None and len(seen) == case.frames:
                        await ws.send(json.dumps({"id": "1", "type": "complete"}))
                        break
        except ConnectionClosed as gone:
            closed = (gone.rcvd.code, gone.rcvd.reason) if gone.rcvd is not None else "closed"
    return seen, closed


async def _both(
    served: Served,
    caplog: pytest.LogCaptureFixture,
    make: Callable[[], Awaitable[tuple[Case, dict[str, str]]]],
    *,
    plain_first: bool,
) -> tuple[list[Any], Any, list[str]]:
    """``make`` (a case and the ids of its own turn) run through each path;
    the frames, the close and the unexpected errors logged must be the same
    (and are returned)."""
    got: dict[bool, tuple[list[Any], Any, list[str]]] = {}
    order = (True, False) if plain_first else (False, True)
    schema = served.schema
    subscription = schema._subscription
    taken: list[bool] = []

    def observed(*args: Any, **kwargs: Any) -> Any:
        taken.append(schema.plain_streams)
        return subscription(*args, **kwargs)

    for plain in order:
        schema.plain_streams = plain
        schema._subscription = observed  # type: ignore[method-assign]
        caplog.clear()
        try:
            case, own = await make()
            frames, closed = await _frames(served.server.ws_url, case, own)
        finally:
            schema.plain_streams = True
            del schema._subscription
        logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        got[plain] = (frames, closed, logged)
    assert got[True] == got[False]
    assert got[True][0], "no frame at all"
    # The comparison is worth something only if the plain path answered.
    assert taken == ([True] if case.plain else [])
    return got[True]


def _fixed(case: Case) -> Callable[[], Awaitable[tuple[Case, dict[str, str]]]]:
    async def make() -> tuple[Case, dict[str, str]]:
        return case, {}

    return make


CASES: dict[str, Callable[[Served], Case]] = {
    "a turn's end, read at once": lambda s: Case(COMPLETED, {"t": s.ended}),
    "a turn's events from the record": lambda s: Case(TURN_EVENTS, {"t": s.ended}),
    "a session's events, the first frames": lambda s: Case(
        "subscription($s: ID!) { sessionEvents(sessionId: $s, afterSeq: 0) "
        "{ seq type turnId __typename } }",
        {"s": s.session},
        frames=3,
    ),
    "an unknown turn": lambda s: Case(COMPLETED, {"t": str(uuid.UUID(int=7))}),
    "an id that is not one": lambda s: Case(COMPLETED, {"t": "not-an-id"}),
    "a variable that does not coerce": lambda s: Case(COMPLETED, {"t": None}),
    "a variable missing": lambda s: Case(COMPLETED),
    "an unknown field": lambda s: Case('subscription { turnCompleted(turnId: "x") { nope } }'),
    "two root fields": lambda s: Case(
        f'subscription {{ a: turnCompleted(turnId: "{s.ended}") {{ id }} '
        f'b: turnCompleted(turnId: "{s.ended}") {{ id }} }}'
    ),
    "too many aliases": lambda s: Case(
        "subscription($t: ID!) { turnCompleted(turnId: $t) { "
        + " ".join(f"a{i}: id" for i in range(40))
        + " } }",
        {"t": s.ended},
    ),
    "too deep": lambda s: Case(
        "subscription($t: ID!) { turnCompleted(turnId: $t) { session { turns { edges { node "
        "{ session { turns { edges { node { id } } } } } } } } } }",
        {"t": s.ended},
    ),
    "too costly": lambda s: Case(
        "subscription($t: ID!) { turnCompleted(turnId: $t) { session { turns(first: 100) "
        "{ edges { node { events(first: 100) { edges { node { seq } } } } } } } } }",
        {"t": s.ended},
    ),
    "a fragment, an operation picked by name": lambda s: Case(
        "fragment T on Turn { id status } query Q { __typename } "
        "subscription S($t: ID!) { turnCompleted(turnId: $t) { ...T output } }",
        {"t": s.ended},
        "S",
    ),
    "a query over the socket": lambda s: Case(
        "query($t: ID!) { turn(id: $t) { id status } }", {"t": s.ended}, plain=False
    ),
    "a document that does not parse": lambda s: Case("subscription {", plain=False),
    "an operation the document lacks": lambda s: Case(
        COMPLETED, {"t": s.ended}, "Nowhere", plain=False
    ),
    "two operations and no name": lambda s: Case(
        'subscription A { turnCompleted(turnId: "x") { id } } '
        'subscription B { turnCompleted(turnId: "x") { id } }'
    ),
    "introspection": lambda s: Case(
        "subscription($t: ID!) { turnCompleted(turnId: $t) { __schema { types { name } } } }",
        {"t": s.ended},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_a_subscription_answers_the_same_frames_both_ways(
    served: Served, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    case = CASES[name](served)
    await _both(served, caplog, _fixed(case), plain_first=sorted(CASES).index(name) % 2 == 0)


@pytest.mark.parametrize(
    ("name", "query"),
    [("a turn's end, live", COMPLETED), ("a turn's events, live", TURN_EVENTS)],
)
async def test_a_live_subscription_answers_the_same_frames_both_ways(
    served: Served, caplog: pytest.LogCaptureFixture, name: str, query: str
) -> None:
    """A turn of its own each time, running when the subscription starts and
    ending while it waits."""

    async def make() -> tuple[Case, dict[str, str]]:
        session = await served.client.create_session()
        submitted = await served.client.submit(session, uuid.uuid4().hex, "/sleep 400 live")
        turn = str(submitted["turn"]["id"])
        # Not ended yet: the subscription that follows waits for the end.
        found = await served.client.execute(
            "query($t: ID!) { turn(id: $t) { status } }", {"t": turn}
        )
        assert found["turn"]["status"] in ("QUEUED", "RUNNING"), found
        return Case(query, {"t": turn}), {"THE-TURN": turn}

    await _both(served, caplog, make, plain_first=query == COMPLETED)


@pytest.mark.parametrize("when", ["at the first read", "after the first record"])
async def test_an_unexpected_error_in_the_stream_is_masked_and_logged_the_same_both_ways(
    served: Served,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    """A stream that fails with what no client caused: one error result,
    masked ("Unexpected error."), and the error logged, either way."""
    real = resolver_streams.session_events

    async def failing(ctx: Any, **kwargs: Any) -> AsyncIterator[Any]:
        if when == "after the first record":
            async for record in real(ctx, **kwargs):
                yield record
                break
        raise RuntimeError("the stream broke")

    monkeypatch.setattr(resolver_streams, "session_events", failing)
    case = Case(
        "subscription($s: ID!) { sessionEvents(sessionId: $s, afterSeq: 0) { seq type } }",
        {"s": served.session},
    )
    frames, _, logged = await _both(
        served, caplog, _fixed(case), plain_first=when == "at the first read"
    )
    errors = [
        f["payload"]["errors"] for f in frames if f["type"] == "next" and "errors" in f["payload"]
    ]
    assert [[e["message"] for e in found] for found in errors] == [["Unexpected error."]]
    assert frames[-1]["type"] == "complete"
    assert len(logged) == 1 and "the stream broke" in logged[0]
