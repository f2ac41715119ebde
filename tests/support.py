"""Test helpers: databases copied from a migrated template, a real server on a
real port, and a small GraphQL-over-HTTP client."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import uvicorn
from sqlalchemy.engine import make_url

from keyturn.app import create_app
from keyturn.db.engine import asyncpg_dsn
from keyturn.serverproc import ServerProcess, free_port, start_server
from keyturn.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


async def admin(url: str) -> Any:
    return await asyncpg.connect(asyncpg_dsn(url))


def fast_settings(**overrides: Any) -> Settings:
    """Short leases and polls, so tests about them take seconds, not minutes."""
    values: dict[str, Any] = {
        "claim_poll_s": 0.2,
        "subscription_poll_s": 0.5,
        "lease_ttl_s": 3.0,
        "lease_renew_s": 0.5,
        "shutdown_grace_s": 5.0,
        "pool_size": 10,
    }
    values.update(overrides)
    return Settings(**values)


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


@dataclass
class InProcessServer:
    """Keyturn's ASGI app under a real uvicorn on a real port, on the test's loop."""

    url: str
    database_url: str
    server: uvicorn.Server
    task: asyncio.Task[None]
    app: Any

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/graphql"


@contextlib.asynccontextmanager
async def serve_in_process(
    database_url: str, settings: Settings | None = None
) -> AsyncIterator[InProcessServer]:
    port = free_port()
    app = create_app(settings or fast_settings(), database_url=database_url)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield InProcessServer(f"http://127.0.0.1:{port}", database_url, server, task, app)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


# Short leases and polls for servers started as processes in tests.
TEST_SERVER_ENV = {
    "KEYTURN_CLAIM_POLL_S": "0.2",
    "KEYTURN_SUBSCRIPTION_POLL_S": "0.5",
    "KEYTURN_LEASE_TTL_S": "3",
    "KEYTURN_LEASE_RENEW_S": "0.5",
    "KEYTURN_LOG_LEVEL": "warning",
}


def start_server_process(
    database_url: str | None,
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    workers: int = 1,
    name: str = "server",
) -> ServerProcess:
    return start_server(
        database_url, log_dir, env={**TEST_SERVER_ENV, **(env or {})}, workers=workers, name=name
    )


def stop_process(server: ServerProcess, timeout: float = 30) -> None:
    server.stop(timeout)


async def counts(db: Any, session_id: str) -> tuple[int, int, int]:
    """(turns, turn.started events, the session's seq counter) straight from the tables."""
    turns = await db.fetchval("SELECT count(*) FROM turns WHERE session_id = $1::uuid", session_id)
    started = await db.fetchval(
        "SELECT count(*) FROM events WHERE session_id = $1::uuid AND type = 'turn.started'",
        session_id,
    )
    seq = await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1::uuid", session_id)
    return turns, started, seq


def new_key() -> str:
    return f"key-{uuid.uuid4()}"


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
