"""GraphQL over HTTP as clients speak it, through the real server: media types
and status codes (the graphql-over-http draft), queries over GET, subscriptions
over multipart/mixed, persisted documents."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect

from keyturn.runtime.auth import create_token
from tests.support import (
    MUTATION_SUBMIT,
    GraphQLClient,
    InProcessServer,
    fast_settings,
    serve_in_process,
)

GRAPHQL_RESPONSE = "application/graphql-response+json"
APOLLO_CLIENT_4 = "application/graphql-response+json,application/json;q=0.9"
APOLLO_MULTIPART = 'multipart/mixed;boundary="graphql";subscriptionSpec=1.0,application/json'
TURN_COMPLETED = "subscription($t: ID!) { turnCompleted(turnId: $t) { id status output } }"
SESSIONS = "{ sessions { totalCount } }"


@pytest.fixture
async def http(server: InProcessServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        yield c


async def nothing_written(db: Any) -> None:
    assert await db.fetchval("SELECT count(*) FROM sessions") == 0
    assert await db.fetchval("SELECT count(*) FROM turns") == 0


def media(response: httpx.Response) -> str:
    return response.headers["content-type"].split(";")[0].strip()


# --- media types and status codes -------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"query": "{ sessions { totalCount }"}, "Syntax Error"),
        ({"query": "{ nope }"}, "Cannot query field 'nope'"),
        (
            {
                "query": "query($n: Int) { sessions(first: $n) { totalCount } }",
                "variables": {"n": "ten"},
            },
            "Variable '$n' has invalid value",
        ),
    ],
)
async def test_graphql_response_json_answers_400_without_data_for_request_errors(
    http: httpx.AsyncClient, db: Any, body: dict[str, Any], message: str
) -> None:
    response = await http.post("/graphql", json=body, headers={"accept": APOLLO_CLIENT_4})
    assert response.status_code == 400
    assert media(response) == GRAPHQL_RESPONSE
    answer = response.json()
    assert "data" not in answer
    assert message in answer["errors"][0]["message"]
    await nothing_written(db)


async def test_a_variables_mistake_is_bad_user_input_in_both_media_types(
    http: httpx.AsyncClient,
) -> None:
    body = {
        "query": "mutation($i: SubmitTurnInput!) { submitTurn(input: $i) { __typename } }",
        "variables": {"i": {"input": "hello"}},
    }
    for accept, status in [(GRAPHQL_RESPONSE, 400), ("application/json", 200)]:
        response = await http.post("/graphql", json=body, headers={"accept": accept})
        assert response.status_code == status
        errors = response.json()["errors"]
        assert all(e["message"].startswith("Variable '$i' has invalid value") for e in errors)
        assert {e["extensions"]["code"] for e in errors} == {"BAD_USER_INPUT"}


async def test_graphql_response_json_is_200_once_execution_starts(
    http: httpx.AsyncClient,
) -> None:
    ok = await http.post("/graphql", json={"query": SESSIONS}, headers={"accept": APOLLO_CLIENT_4})
    assert ok.status_code == 200 and media(ok) == GRAPHQL_RESPONSE
    assert ok.json() == {"data": {"sessions": {"totalCount": 0}}}
    # An error raised while executing a field is still a 200, with data.
    failed = await http.post(
        "/graphql",
        json={"query": "{ sessions(first: 1000) { totalCount } }"},
        headers={"accept": GRAPHQL_RESPONSE},
    )
    assert failed.status_code == 200 and media(failed) == GRAPHQL_RESPONSE
    answer = failed.json()
    assert "data" in answer and answer["errors"][0]["path"] == ["sessions"]


@pytest.mark.parametrize("accept", [None, "application/json", "*/*", "application/json, */*"])
async def test_application_json_stays_200_with_data_null(
    http: httpx.AsyncClient, accept: str | None
) -> None:
    headers = {"accept": accept} if accept else {}
    response = await http.post("/graphql", json={"query": "{ nope }"}, headers=headers)
    assert response.status_code == 200
    assert media(response) == "application/json"
    assert response.json()["data"] is None
    ok = await http.post("/graphql", json={"query": SESSIONS}, headers=headers)
    assert ok.status_code == 200 and media(ok) == "application/json"


async def test_the_preferred_media_type_wins_by_q(http: httpx.AsyncClient) -> None:
    prefer_json = "application/graphql-response+json;q=0.5, application/json"
    response = await http.post(
        "/graphql", json={"query": SESSIONS}, headers={"accept": prefer_json}
    )
    assert media(response) == "application/json"


async def test_malformed_requests_get_a_graphql_error_body(http: httpx.AsyncClient) -> None:
    cases = [
        (b"{not json", 400),
        (json.dumps({"query": 5}).encode(), 400),
        (json.dumps({"query": SESSIONS, "variables": [1]}).encode(), 400),
        (json.dumps({}).encode(), 400),
    ]
    for body, status in cases:
        for accept in (GRAPHQL_RESPONSE, "application/json"):
            response = await http.post(
                "/graphql",
                content=body,
                headers={"content-type": "application/json", "accept": accept},
            )
            assert response.status_code == status, body
            assert media(response) == accept
            assert response.json()["errors"][0]["extensions"]["code"] == "BAD_REQUEST"


async def test_other_methods_are_405_with_allow(http: httpx.AsyncClient) -> None:
    response = await http.put("/graphql", json={"query": SESSIONS})
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, POST"
    assert response.json()["errors"][0]["extensions"]["code"] == "METHOD_NOT_ALLOWED"


# --- GET ---------------------------------------------------------------------


async def test_a_query_over_get_with_url_encoded_variables(
    http: httpx.AsyncClient, client: GraphQLClient
) -> None:
    sid = await client.create_session()
    params = {
        "query": "query Q($id: ID!) { session(id: $id) { id eventCount } }",
        "variables": json.dumps({"id": sid}),
        "operationName": "Q",
    }
    for accept in (GRAPHQL_RESPONSE, "application/json", "*/*"):
        response = await http.get("/graphql", params=params, headers={"accept": accept})
        assert response.status_code == 200, response.text
        assert response.json() == {"data": {"session": {"id": sid, "eventCount": 0}}}
        assert "Authorization" in response.headers["vary"]


async def test_a_mutation_over_get_is_405_and_writes_nothing(
    http: httpx.AsyncClient, db: Any
) -> None:
    for accept in (GRAPHQL_RESPONSE, "application/json"):
        response = await http.get(
            "/graphql",
            params={"query": "mutation { createSession { id } }"},
            headers={"accept": accept},
        )
        assert response.status_code == 405
        assert response.headers["allow"] == "POST"
        assert media(response) == accept
        [error] = response.json()["errors"]
        assert error["extensions"]["code"] == "METHOD_NOT_ALLOWED"
        assert "POST" in error["message"]
    await nothing_written(db)


async def test_a_bad_document_over_get_is_400(http: httpx.AsyncClient) -> None:
    response = await http.get(
        "/graphql", params={"query": "{ nope"}, headers={"accept": GRAPHQL_RESPONSE}
    )
    assert response.status_code == 400 and "data" not in response.json()
    bad_variables = await http.get(
        "/graphql", params={"query": SESSIONS, "variables": "{oops"}, headers={"accept": "*/*"}
    )
    assert bad_variables.status_code == 400
    assert bad_variables.json()["errors"][0]["extensions"]["code"] == "BAD_REQUEST"


async def test_a_browser_still_gets_graphiql(http: httpx.AsyncClient) -> None:
    page = await http.get("/graphql", headers={"accept": "text/html,application/xhtml+xml"})
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
    assert "graphiql" in page.text.lower()


# --- subscriptions over HTTP -------------------------------------------------


def multipart_parts(body: str) -> list[Any]:
    """The JSON parts of an Apollo multipart subscription answer, heartbeats too."""
    parts = []
    for chunk in body.split("--graphql"):
        _, sep, payload = chunk.partition("\r\n\r\n")
        if sep and payload.strip():
            parts.append(json.loads(payload.strip()))
    return parts


async def test_a_subscription_streams_over_multipart_mixed(
    http: httpx.AsyncClient, client: GraphQLClient
) -> None:
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "/sleep 300 over multipart"))["turn"]
    async with http.stream(
        "POST",
        "/graphql",
        json={"query": TURN_COMPLETED, "variables": {"t": turn["id"]}},
        headers={"accept": APOLLO_MULTIPART},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("multipart/mixed")
        body = (await asyncio.wait_for(response.aread(), 30)).decode()
    assert body.rstrip().endswith("--graphql--")
    payloads = [p["payload"] for p in multipart_parts(body) if "payload" in p]
    assert payloads == [
        {
            "data": {
                "turnCompleted": {
                    "id": turn["id"],
                    "status": "COMPLETED",
                    "output": payloads[0]["data"]["turnCompleted"]["output"],
                }
            }
        }
    ]


async def test_a_subscription_error_over_multipart_is_public_not_masked(
    http: httpx.AsyncClient,
) -> None:
    response = await http.post(
        "/graphql",
        json={"query": TURN_COMPLETED, "variables": {"t": "00000000-0000-0000-0000-000000000000"}},
        headers={"accept": APOLLO_MULTIPART},
    )
    text = json.dumps(multipart_parts(response.text))
    assert "not found" in text.lower() and "Unexpected error" not in text


@pytest.mark.parametrize("accept", [GRAPHQL_RESPONSE, "application/json", None])
async def test_a_subscription_without_a_stream_says_how_to_subscribe(
    http: httpx.AsyncClient, accept: str | None
) -> None:
    headers = {"accept": accept} if accept else {}
    for response in (
        await http.post(
            "/graphql",
            json={"query": 'subscription { sessionEvents(sessionId: "x") { seq } }'},
            headers=headers,
        ),
        await http.get(
            "/graphql",
            params={"query": 'subscription { sessionEvents(sessionId: "x") { seq } }'},
            headers=headers,
        ),
    ):
        assert response.status_code == 400
        [error] = response.json()["errors"]
        assert "graphql-transport-ws" in error["message"]
        assert "multipart/mixed" in error["message"]
        assert error["message"] != "Unexpected error."


async def test_multipart_subscriptions_pass_the_front_door(database_url: str) -> None:
    async with serve_in_process(database_url) as srv:
        token = await create_token(srv.app.state.runtime.engine, name="alice")
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
            body = {"query": TURN_COMPLETED, "variables": {"t": "x"}}
            anonymous = await http.post("/graphql", json=body, headers={"accept": APOLLO_MULTIPART})
            assert anonymous.status_code == 401
            too_big = await http.post(
                "/graphql",
                json={**body, "variables": {"t": "x" * (1024 * 1024)}},
                headers={"accept": APOLLO_MULTIPART, "authorization": f"Bearer {token}"},
            )
            assert too_big.status_code == 413


# --- persisted documents -----------------------------------------------------


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def persisted(text: str) -> dict[str, Any]:
    return {"persistedQuery": {"version": 1, "sha256Hash": sha(text)}}


async def test_automatic_persisted_queries(http: httpx.AsyncClient) -> None:
    query = "query Count { sessions { totalCount } }"
    hash_only = {"extensions": persisted(query)}
    missing = await http.post("/graphql", json=hash_only)
    [error] = missing.json()["errors"]
    assert error["message"] == "PersistedQueryNotFound"
    assert error["extensions"]["code"] == "PERSISTED_QUERY_NOT_FOUND"

    mismatch = await http.post(
        "/graphql", json={"query": "{ sessions { edges { cursor } } }", **hash_only}
    )
    assert mismatch.status_code == 400
    assert mismatch.json()["errors"][0]["extensions"]["code"] == "PERSISTED_QUERY_HASH_MISMATCH"
    assert (await http.post("/graphql", json=hash_only)).json()["errors"][0][
        "message"
    ] == "PersistedQueryNotFound"

    registered = await http.post("/graphql", json={"query": query, **hash_only})
    assert registered.status_code == 200 and registered.json()["data"]["sessions"]
    again = await http.post("/graphql", json=hash_only)
    assert again.status_code == 200 and again.json() == {"data": {"sessions": {"totalCount": 0}}}
    over_get = await http.get(
        "/graphql",
        params={"extensions": json.dumps(persisted(query))},
        headers={"accept": "application/json"},
    )
    assert over_get.status_code == 200 and over_get.json() == again.json()


@pytest.mark.parametrize(
    "extension",
    [
        {"version": 2, "sha256Hash": "0" * 64},
        {"version": 1, "sha256Hash": "not hex"},
        {"version": 1},
        "yes",
    ],
)
async def test_a_malformed_persisted_query_extension_is_400(
    http: httpx.AsyncClient, extension: Any
) -> None:
    response = await http.post(
        "/graphql", json={"query": SESSIONS, "extensions": {"persistedQuery": extension}}
    )
    assert response.status_code == 400
    assert response.json()["errors"][0]["extensions"]["code"] in {
        "PERSISTED_QUERY_NOT_SUPPORTED",
        "BAD_REQUEST",
    }


async def test_a_persisted_mutation_is_still_no_get(http: httpx.AsyncClient, db: Any) -> None:
    mutation = "mutation { createSession { id } }"
    assert (
        await http.post("/graphql", json={"query": mutation, **{"extensions": persisted(mutation)}})
    ).status_code == 200
    response = await http.get(
        "/graphql",
        params={"extensions": json.dumps(persisted(mutation))},
        headers={"accept": "application/json"},
    )
    assert response.status_code == 405
    assert await db.fetchval("SELECT count(*) FROM sessions") == 1


async def test_registered_only_runs_nothing_but_registered_documents(
    database_url: str, tmp_path: Path, db: Any
) -> None:
    registered = "query Count { sessions { totalCount } }"
    path = tmp_path / "documents.json"
    path.write_text(json.dumps({sha(registered): registered}))
    settings = fast_settings(persisted_documents="registered_only", persisted_documents_file=path)
    async with serve_in_process(database_url, settings) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
            by_hash = await http.post("/graphql", json={"extensions": persisted(registered)})
            assert by_hash.json() == {"data": {"sessions": {"totalCount": 0}}}
            by_text = await http.post("/graphql", json={"query": registered})
            assert by_text.json() == by_hash.json()
            other = "mutation { createSession { id } }"
            for body in (
                {"query": other},
                {"query": other, "extensions": persisted(other)},
                {"extensions": persisted(other)},
            ):
                response = await http.post("/graphql", json=body)
                assert response.status_code == 400
                code = response.json()["errors"][0]["extensions"]["code"]
                assert code == "PERSISTED_QUERY_NOT_IN_LIST"
        # WebSockets too.
        async with ws_connect(srv.ws_url, subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
            await ws.send(json.dumps({"type": "connection_init", "payload": {}}))
            assert json.loads(await ws.recv())["type"] == "connection_ack"
            await ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": {"query": other}}))
            message = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert message["type"] == "error"
            assert message["payload"][0]["extensions"]["code"] == "PERSISTED_QUERY_NOT_IN_LIST"
    await nothing_written(db)


async def test_a_documents_file_that_lies_about_a_hash_refuses_to_start(tmp_path: Path) -> None:
    from keyturn.http.app import create_app

    path = tmp_path / "documents.json"
    path.write_text(json.dumps({"0" * 64: "{ sessions { totalCount } }"}))
    with pytest.raises(ValueError, match="not the SHA-256 of its text"):
        create_app(
            fast_settings(persisted_documents="registered_only", persisted_documents_file=path),
            database_url="postgresql://unused/db",
        )


async def test_replay_through_graphql_response_json(
    http: httpx.AsyncClient, client: GraphQLClient
) -> None:
    sid = await client.create_session()
    variables = {"input": {"sessionId": sid, "idempotencyKey": "k", "input": "hi"}}
    answers = [
        (
            await http.post(
                "/graphql",
                json={"query": MUTATION_SUBMIT, "variables": variables},
                headers={"accept": APOLLO_CLIENT_4},
            )
        ).json()["data"]["submitTurn"]
        for _ in range(2)
    ]
    assert [a["__typename"] for a in answers] == ["TurnAccepted", "TurnReplayed"]
    assert answers[0]["turn"]["id"] == answers[1]["turn"]["id"]


@pytest.mark.parametrize("body", ['"str"', "123", "null", "true"])
async def test_a_json_body_that_is_not_an_object_is_a_400(
    http: httpx.AsyncClient, db: Any, body: str
) -> None:
    response = await http.post(
        "/graphql", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["message"].startswith("the request body must be a JSON object")
    assert error["extensions"]["code"] == "BAD_REQUEST"
    await nothing_written(db)


@pytest.mark.parametrize("media", ["Application/JSON", "APPLICATION/json; charset=UTF-8"])
async def test_media_types_are_case_insensitive(http: httpx.AsyncClient, media: str) -> None:
    response = await http.post(
        "/graphql",
        content=json.dumps({"query": "mutation { createSession { id } }"}),
        headers={"content-type": media},
    )
    assert response.status_code == 200, response.text
    assert response.json()["data"]["createSession"]["id"]
