"""Talking to a server as clients do: GraphQL over HTTP (httpx) and over
WebSocket (gql, subprotocol graphql-transport-ws)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

MUTATION_SUBMIT = """
mutation Submit($input: SubmitTurnInput!) {
  submitTurn(input: $input) {
    __typename
    ... on TurnAdmission { replayed turn { id status history input idempotencyKey output } }
    ... on UserError { code message }
    ... on IdempotencyConflict { idempotencyKey existingTurnId }
    ... on SessionNotFound { sessionId }
    ... on InvalidInput { field }
  }
}
"""


class GraphQLClient:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.http = httpx.AsyncClient(base_url=base_url, timeout=30)

    async def close(self) -> None:
        await self.http.aclose()

    async def raw(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = await self.http.post(
            "/graphql", json={"query": query, "variables": variables or {}}
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def execute(self, query: str, variables: dict[str, Any] | None = None) -> Any:
        body = await self.raw(query, variables)
        assert not body.get("errors"), body["errors"]
        return body["data"]

    async def create_session(self, default_history: str | None = None) -> str:
        if default_history is None:
            data = await self.execute("mutation { createSession { id } }")
        else:
            data = await self.execute(
                "mutation($h: HistoryMode) { createSession(input: {defaultHistory: $h}) { id } }",
                {"h": default_history},
            )
        return str(data["createSession"]["id"])

    async def submit(
        self, session_id: str, key: str, input: str, history: str | None = None
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"sessionId": session_id, "idempotencyKey": key, "input": input}
        if history is not None:
            payload["history"] = history
        data = await self.execute(MUTATION_SUBMIT, {"input": payload})
        result: dict[str, Any] = data["submitTurn"]
        return result

    async def session(self, session_id: str) -> dict[str, Any]:
        data = await self.execute(
            """query($id: ID!) { session(id: $id) {
                 id eventCount defaultHistory
                 events(first: 100) { totalCount edges { node { seq type turnId data } } }
                 turns(first: 100) { totalCount edges { node { id status input output history } } }
               } }""",
            {"id": session_id},
        )
        result: dict[str, Any] = data["session"]
        return result

    async def turn(self, turn_id: str) -> dict[str, Any] | None:
        data = await self.execute(
            """query($id: ID!) { turn(id: $id) {
                 id status input output error history epoch owner
                 events { seq type data } } }""",
            {"id": turn_id},
        )
        result: dict[str, Any] | None = data["turn"]
        return result

    async def wait_for_status(
        self, turn_id: str, statuses: set[str], within: float = 20
    ) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            turn = await self.turn(turn_id)
            assert turn is not None
            if turn["status"] in statuses:
                return turn
            if time.monotonic() > deadline:
                raise AssertionError(f"turn {turn_id} stuck in {turn['status']}")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def ws_session(ws_url: str) -> AsyncIterator[Any]:
    """A gql client session over WebSocket, subprotocol graphql-transport-ws."""
    from gql import Client
    from gql.transport.websockets import WebsocketsTransport

    transport = WebsocketsTransport(
        url=ws_url, subprotocols=[WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL]
    )
    async with Client(transport=transport, fetch_schema_from_transport=False) as session:
        yield session


def request(query: str, **variables: Any) -> Any:
    from gql import GraphQLRequest

    return GraphQLRequest(query, variable_values=variables)


TURN_COMPLETED = "subscription($t: ID!) { turnCompleted(turnId: $t) { id status output error } }"
SESSION_EVENTS = (
    "subscription($s: ID!, $a: Int) { sessionEvents(sessionId: $s, afterSeq: $a) "
    "{ seq type turnId data } }"
)
