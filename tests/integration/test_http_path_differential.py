"""Queries and mutations over HTTP answer the same bytes three ways: a POST
answered by the view's own direct path (``direct_post``, the default) and
run by KeyturnSchema.run_operation (the default too); the same request
through Strawberry's HTTP view (``direct_post = False``); and through that
view run by Strawberry's Schema.execute with its extension runner
(``plain_execution = False``).

One real server on PostgreSQL, in process, so the view can be switched
between two requests; every request below is sent both ways on the same
record, the order alternating (the first of a pair parses and validates the
document, the second finds it kept), in each media type a client asks for.
Compared: the status, every header but the date and the request id, and the
body's bytes; and what the unexpected errors put in the log.

Covered: answers with data, variables and operation names; public errors
(their code and retryable flag); a mutation's InvalidInput member; variables
that do not coerce; parse, validation, depth, alias and cost refusals;
introspection (and its refusal on a server without it); the response-size
limit; an unexpected error, masked and logged; queries over GET and a
mutation over GET; a subscription without a stream; a document without an
operation, or naming one it lacks; batches; persisted-document refusals.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio

from keyturn.http.app import KeyturnGraphQL
from keyturn.ops import databases
from keyturn.schema import KeyturnSchema
from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process

GRAPHQL_RESPONSE = "application/graphql-response+json"
ACCEPTS: tuple[str | None, ...] = (
    None,
    "application/json",
    GRAPHQL_RESPONSE,
    "application/graphql-response+json,application/json;q=0.9",
)
# Differ between any two requests, whatever answered them.
UNCOMPARED = {"date", "x-request-id", "content-length"}
MAX_RESPONSE_BYTES = 2048

SUBMIT = """mutation Submit($input: SubmitTurnInput!) {
  submitTurn(input: $input) {
    __typename
    ... on TurnAdmission { replayed turn { id status history idempotencyKey } }
    ... on UserError { code message }
    ... on IdempotencyConflict { idempotencyKey existingTurnId }
    ... on SessionNotFound { sessionId }
    ... on InvalidInput { field }
  }
}"""
PAGE = (
    "query($id: ID!, $after: String) { session(id: $id) { events(first: 100, after: $after) "
    "{ edges { cursor node { seq type data } } pageInfo { hasNextPage endCursor } } } }"
)


@dataclass
class Record:
    session: str
    turn: str
    key: str
    large_session: str
    large_turn: str


@dataclass
class Served:
    server: InProcessServer
    view: KeyturnGraphQL
    http: httpx.AsyncClient
    record: Record
    introspection: bool
    # The bodies of the POSTs the direct path answered (the rest it handed
    # to Strawberry's view).
    direct: set[bytes] = field(default_factory=set)


# One server that allows introspection and one that does not (its schema is
# built apart, with DisableIntrospection's rule and a smaller depth limit).
SETTINGS = {
    "open": {"max_response_bytes": MAX_RESPONSE_BYTES},
    "closed": {
        "max_response_bytes": MAX_RESPONSE_BYTES,
        "introspection": False,
        "max_query_depth": 6,
    },
}


async def seed(client: GraphQLClient) -> Record:
    session = await client.create_session()
    key = uuid.uuid4().hex
    answer = await client.submit(session, key, "hello")
    turn = str(answer["turn"]["id"])
    # Its input alone is past the response-size limit, and so is a page of
    # its session's events.
    large_session = await client.create_session()
    large = await client.execute(
        "mutation($i: SubmitTurnInput!) { submitTurn(input: $i) "
        "{ ... on TurnAdmission { turn { id } } } }",
        {
            "i": {
                "sessionId": large_session,
                "idempotencyKey": uuid.uuid4().hex,
                "input": "x" * 3000,
            }
        },
    )
    large_turn = str(large["submitTurn"]["turn"]["id"])
    # Ended, so a replay answers the same status every time (the large
    # turn's own answer is past the size limit: only its status is read).
    deadline = time.monotonic() + 60
    for t in (turn, large_turn):
        while True:
            found = await client.execute("query($id: ID!) { turn(id: $id) { status } }", {"id": t})
            if found["turn"]["status"] in ("COMPLETED", "FAILED"):
                break
            assert time.monotonic() < deadline, found
            await asyncio.sleep(0.05)
    return Record(session, turn, key, large_session, large_turn)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=sorted(SETTINGS))
async def served(
    request: pytest.FixtureRequest, server_url: str, template_db: str
) -> AsyncIterator[Served]:
    overrides: dict[str, Any] = SETTINGS[request.param]
    async with (
        databases.throwaway(server_url, prefix="keyturn_t", template=template_db) as url,
        serve_in_process(url, fast_settings(**overrides)) as server,
    ):
        client = GraphQLClient(server.url)
        try:
            record = await seed(client)
        finally:
            await client.close()
        view = server.view
        # The comparison is only worth something if the default path is
        # the one without Strawberry's runner.
        assert view.plain_execution
        assert isinstance(view.schema, KeyturnSchema) and view.schema.plain is not None
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            served = Served(
                server, view, http, record, overrides.get("introspection", True) is not False
            )
            post_directly = view.post_directly

            async def observed(scope: Any, body: bytes, receive: Any, send: Any) -> bool:
                answered = await post_directly(scope, body, receive, send)
                if answered:
                    served.direct.add(body)
                return answered

            view.post_directly = observed  # type: ignore[method-assign]
            yield served


@dataclass(frozen=True)
class Sent:
    method: str
    body: bytes | None = None  # POST
    params: dict[str, str] | None = None  # GET
    content_type: str = "application/json"


def post(
    query: str | None, variables: Any = None, operation: str | None = None, **more: Any
) -> Sent:
    payload: dict[str, Any] = {"query": query, **more}
    if variables is not None:
        payload["variables"] = variables
    if operation is not None:
        payload["operationName"] = operation
    return Sent("POST", orjson.dumps(payload))


def get(query: str, variables: Any = None, operation: str | None = None) -> Sent:
    params = {"query": query}
    if variables is not None:
        params["variables"] = (
            variables if isinstance(variables, str) else orjson.dumps(variables).decode()
        )
    if operation is not None:
        params["operationName"] = operation
    return Sent("GET", params=params)


def requests(record: Record) -> dict[str, Sent]:
    """Every request, by what it is about."""
    s, t = record.session, record.turn
    missing = str(uuid.UUID(int=0))
    submit = {"sessionId": s, "idempotencyKey": record.key, "input": "hello"}
    deep = "{ sessions { edges { node { turns { edges { node { events { seq } } } } } } } }"
    aliased = "{ " + " ".join(f"a{i}: sessions {{ totalCount }}" for i in range(40)) + " }"
    # Past the cost limit, within the depth and alias limits.
    costly = (
        "{ "
        + " ".join(
            f"a{i}: sessions(first: 100) {{ edges {{ node {{ turns(first: 100) "
            "{ edges { cursor } } } } }"
            for i in range(25)
        )
        + " }"
    )
    two = (
        "query First { sessions { totalCount } } "
        "query Second($id: ID!) { session(id: $id) { id eventCount } }"
    )
    return {
        "query": post("{ sessions { totalCount edges { node { id } } } }"),
        "query with variables": post(
            "query($id: ID!) { turn(id: $id) { id status input output history } }", {"id": t}
        ),
        "page of events": post(PAGE, {"id": s, "after": None}),
        "page after a cursor": post(PAGE, {"id": s, "after": "ZXZlbnQ6Mg"}),
        "named operation": post(two, {"id": s}, "Second"),
        "first of two, none named": post(two, {"id": s}),
        "replayed submitTurn": post(SUBMIT, {"input": submit}),
        "conflicting submitTurn": post(SUBMIT, {"input": {**submit, "input": "other"}}),
        "submitTurn to a missing session": post(
            SUBMIT, {"input": {**submit, "sessionId": missing}}
        ),
        "invalid input": post(SUBMIT, {"input": {**submit, "idempotencyKey": ""}}),
        "not found": post("query($id: ID!) { session(id: $id) { id } }", {"id": "nope"}),
        "public error": post("{ sessions(first: -1) { totalCount } }"),
        "bad cursor": post(PAGE, {"id": s, "after": "nope"}),
        "cancel of a missing turn": post(
            "mutation($i: CancelTurnInput!) { cancelTurn(input: $i) { __typename } }",
            {"i": {"turnId": missing, "idempotencyKey": "k"}},
        ),
        "variable of a wrong type": post(
            "query($n: Int) { sessions(first: $n) { totalCount } }", {"n": "ten"}
        ),
        "missing variable": post("query($id: ID!) { turn(id: $id) { id } }", {}),
        "null for a non-null variable": post(
            "query($id: ID!) { turn(id: $id) { id } }", {"id": None}
        ),
        "input missing a field": post(SUBMIT, {"input": {"sessionId": s}}),
        "variables not an object": post("{ sessions { totalCount } }", [1, 2]),
        "syntax error": post("{ sessions { totalCount }"),
        "too many tokens": post("{ " + "a " * 2100 + "}"),
        "unknown field": post("{ nope }"),
        "unknown argument": post("{ sessions(nope: 1) { totalCount } }"),
        "too deep": post(deep),
        "too many aliases": post(aliased),
        "too costly": post(costly),
        "introspection": post('{ __schema { queryType { name } } __type(name: "Turn") { name } }'),
        "typename only": post("{ __typename }"),
        "past the size limit": post(
            "query($id: ID!) { turn(id: $id) { id input } }", {"id": record.large_turn}
        ),
        "past the size limit in a list": post(PAGE, {"id": record.large_session}),
        "no operation": post("fragment F on Query { __typename }"),
        "unknown operation name": post("{ sessions { totalCount } }", None, "Nope"),
        "no query": post(None),
        "empty query": post(""),
        "subscription over POST": post('subscription { sessionEvents(sessionId: "x") { seq } }'),
        "unknown persisted document": post(
            None, extensions={"persistedQuery": {"version": 1, "sha256Hash": "0" * 64}}
        ),
        "batch": Sent(
            "POST",
            orjson.dumps(
                [
                    {"query": "{ sessions { totalCount } }"},
                    {"query": "{ nope }"},
                    {"query": "query($id: ID!) { turn(id: $id) { id } }", "variables": {"id": t}},
                ]
            ),
        ),
        "query over GET": get("query($id: ID!) { turn(id: $id) { id status } }", {"id": t}),
        "page over GET": get(PAGE, {"id": s}),
        "validation error over GET": get("{ nope }"),
        "variables error over GET": get(
            "query($n: Int) { sessions(first: $n) { totalCount } }", {"n": "x"}
        ),
        "variables not JSON over GET": get("{ sessions { totalCount } }", "{nope"),
        "mutation over GET": get(SUBMIT, {"input": submit}),
        "named mutation over GET": get(two + " mutation M { createSession { id } }", None, "M"),
        "subscription over GET": get('subscription { sessionEvents(sessionId: "x") { seq } }'),
        "application/graphql body": Sent(
            "POST", b"{ sessions { totalCount } }", content_type="application/graphql"
        ),
    }


@dataclass(frozen=True)
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    logged: tuple[str, ...]


# (direct_post, plain_execution): the defaults first.
WAYS = ((True, True), (False, True), (False, False))


async def send(
    served: Served,
    sent: Sent,
    accept: str | None,
    way: tuple[bool, bool],
    caplog: pytest.LogCaptureFixture,
) -> Answer:
    served.view.direct_post, served.view.plain_execution = way
    headers = {"content-type": sent.content_type} if sent.method == "POST" else {}
    if accept is not None:
        headers["accept"] = accept
    caplog.clear()
    try:
        if sent.method == "POST":
            response = await served.http.post("/graphql", content=sent.body, headers=headers)
        else:
            response = await served.http.get("/graphql", params=sent.params, headers=headers)
    finally:
        served.view.direct_post = served.view.plain_execution = True
    logged = tuple(
        f"{r.levelname} {r.getMessage()} {r.exc_info[1]!r}" if r.exc_info else r.getMessage()
        for r in caplog.records
        if r.name == "keyturn.schema.errors"
    )
    kept = tuple(sorted((k, v) for k, v in response.headers.items() if k not in UNCOMPARED))
    return Answer(response.status_code, kept, response.content, logged)


async def every_way(
    served: Served,
    sent: Sent,
    accept: str | None,
    start: int,
    caplog: pytest.LogCaptureFixture,
) -> Answer:
    """The answer, the same every way; sent in turn from way ``start``, so
    each way is in turn the one that parses and validates the document."""
    answers: dict[tuple[bool, bool], Answer] = {}
    for n in range(len(WAYS)):
        way = WAYS[(start + n) % len(WAYS)]
        answers[way] = await send(served, sent, accept, way, caplog)
    default = answers[WAYS[0]]
    for way, answer in answers.items():
        assert answer == default, (sent, accept, way, answer, default)
    return default


def body(answer: Answer) -> Any:
    return orjson.loads(answer.body)


@pytest.mark.asyncio(loop_scope="module")
async def test_every_request_answers_the_same_both_ways(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="keyturn.schema.errors")
    answers: dict[str, Answer] = {}
    for n, (about, sent) in enumerate(requests(served.record).items()):
        for m, accept in enumerate(ACCEPTS):
            answer = await every_way(served, sent, accept, n + m, caplog)
            if accept == "application/json":
                answers[about] = answer
    # The requests reach what they are named for (else the comparison above
    # would be of something else).
    every = requests(served.record)
    plain = {about for about, s in every.items() if s.method == "POST" and s.body in served.direct}
    assert plain == {
        about
        for about, s in every.items()
        if s.method == "POST" and s.content_type == "application/json"
    } - {"variables not an object", "no query", "batch"}
    assert body(answers["query"])["data"]["sessions"]["totalCount"] == 2
    assert body(answers["page of events"])["data"]["session"]["events"]["edges"]
    assert body(answers["replayed submitTurn"])["data"]["submitTurn"]["replayed"] is True
    assert body(answers["invalid input"])["data"]["submitTurn"]["__typename"] == "InvalidInput"
    coded = body(answers["public error"])["errors"][0]["extensions"]
    assert coded["code"] == "BAD_USER_INPUT" and coded["retryable"] is False
    assert body(answers["variable of a wrong type"])["errors"][0]["extensions"]["code"] == (
        "BAD_USER_INPUT"
    )
    assert "Syntax Error" in body(answers["syntax error"])["errors"][0]["message"]
    assert "aliases" in answers["too many aliases"].body.decode()
    if not served.introspection:  # the server with the smaller depth limit
        assert "depth" in answers["too deep"].body.decode()
    assert "cost" in answers["too costly"].body.decode().lower()
    too_large = body(answers["past the size limit"])
    assert too_large["data"] is None
    assert too_large["errors"][0]["extensions"]["code"] == "RESPONSE_TOO_LARGE"
    assert answers["mutation over GET"].status == 405
    assert answers["subscription over POST"].status == 400
    assert answers["unknown operation name"].status == 400
    assert answers["no query"].status == 400
    introspected = body(answers["introspection"])
    if served.introspection:
        assert introspected["data"]["__schema"]["queryType"]["name"] == "Query"
    else:
        assert introspected["data"] is None and introspected["errors"]


@pytest.mark.asyncio(loop_scope="module")
async def test_an_unexpected_error_is_masked_and_logged_the_same_both_ways(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="keyturn.schema.errors")
    runtime = served.server.app.state.runtime

    async def broken(*_a: Any, **_k: Any) -> None:
        raise RuntimeError('relation "secret_table" does not exist')

    original: Callable[..., Any] = runtime.reads.sessions
    runtime.reads.sessions = broken
    try:
        for n, accept in enumerate(ACCEPTS):
            for sent in (
                post("{ sessions { totalCount } }"),
                get("{ sessions { totalCount } }"),
                post("{ a: sessions { totalCount } __typename }"),
            ):
                answer = await every_way(served, sent, accept, n, caplog)
                assert body(answer)["errors"][0]["message"] == "Unexpected error."
                assert b"secret_table" not in answer.body
                assert answer.logged and "secret_table" in answer.logged[0]
    finally:
        runtime.reads.sessions = original
