"""Servers for tests: the ASGI app under a real uvicorn on the test's own event
loop, or ``keyturn serve`` as a child process; short leases and polls for both."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.routing import Route

from keyturn.http.app import KeyturnGraphQL, create_app
from keyturn.ops import serving
from keyturn.ops.serverproc import ServerProcess, bound_socket, start_server
from keyturn.settings import Settings


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

    @property
    def view(self) -> KeyturnGraphQL:
        """The app's /graphql view (its documents, its shares of tenants)."""
        return next(
            r.endpoint
            for r in self.app.routes
            if isinstance(r, Route) and isinstance(r.endpoint, KeyturnGraphQL)
        )


@contextlib.asynccontextmanager
async def serve_in_process(
    database_url: str, settings: Settings | None = None
) -> AsyncIterator[InProcessServer]:
    sock = bound_socket()
    port = int(sock.getsockname()[1])
    settings = settings or fast_settings()
    app = create_app(settings, database_url=database_url)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        # As `keyturn serve` sets them.
        http=serving.HTTP,
        ws=serving.WEBSOCKETS,
        ws_max_size=settings.max_body_bytes,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield InProcessServer(f"http://127.0.0.1:{port}", database_url, server, task, app)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
        sock.close()


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


@contextlib.contextmanager
def two_server_processes(
    database_url: str, log_dir: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two real ``keyturn serve`` processes on one database, ``a`` and ``b``;
    both stopped afterwards (one a test killed is left as it is)."""
    a = start_server_process(database_url, log_dir, name="a", env=env)
    try:
        b = start_server_process(database_url, log_dir, name="b", env=env)
    except BaseException:
        stop_process(a)
        raise
    try:
        yield a, b
    finally:
        for server in (a, b):
            if server.proc.poll() is None:
                stop_process(server)


def owner_process(turn: dict[str, Any], servers: Sequence[ServerProcess]) -> ServerProcess:
    """The process whose worker ran ``turn`` (the pid in its owner id)."""
    pid = int(turn["owner"].split(":")[1])
    return next(s for s in servers if s.proc.pid == pid)
