"""Test helpers: databases copied from a migrated template, a real server on a
real port, and a small GraphQL-over-HTTP client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import uvicorn
from sqlalchemy.engine import make_url

from keyturn.app import create_app
from keyturn.db.engine import asyncpg_dsn
from keyturn.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@dataclass
class ServerProcess:
    """``keyturn serve`` as a real process."""

    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/graphql"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server_process(
    database_url: str | None,
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    workers: int = 1,
    name: str = "server",
) -> ServerProcess:
    port = free_port()
    full_env = dict(os.environ)
    for k in list(full_env):
        if k.startswith("KEYTURN_") or k == "DATABASE_URL":
            del full_env[k]
    full_env.update(
        {
            "KEYTURN_CLAIM_POLL_S": "0.2",
            "KEYTURN_SUBSCRIPTION_POLL_S": "0.5",
            "KEYTURN_LEASE_TTL_S": "3",
            "KEYTURN_LEASE_RENEW_S": "0.5",
            "KEYTURN_LOG_LEVEL": "warning",
        }
    )
    if database_url is not None:
        full_env["KEYTURN_DATABASE_URL"] = database_url
    full_env.update(env or {})
    log_path = log_dir / f"{name}-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keyturn",
                "serve",
                "--port",
                str(port),
                "--workers",
                str(workers),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=log_dir,
        )
    server = ServerProcess(f"http://127.0.0.1:{port}", proc, log_path)
    wait_healthy(server)
    return server


def wait_healthy(server: ServerProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise AssertionError(f"server exited early:\n{server.log()}")
        try:
            if httpx.get(server.url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"server not healthy in {timeout}s:\n{server.log()}")


def stop_process(server: ServerProcess, timeout: float = 30) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


def new_key() -> str:
    return f"key-{uuid.uuid4()}"


def iter_lines(text: str) -> Iterator[str]:
    yield from text.splitlines()


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
