"""Fixtures: one PostgreSQL per run, one migrated template, one database per test.

The server is the one named by ``KEYTURN_TEST_DATABASE_URL`` when it is set (CI
points it at the machine's PostgreSQL), else the embedded PostgreSQL that
Keyturn itself uses by default.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from keyturn.ops import databases
from tests.support import (
    ROOT,
    GraphQLClient,
    InProcessServer,
    admin,
    serve_in_process,
)

ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    external = os.environ.get("KEYTURN_TEST_DATABASE_URL")
    if external:
        yield external
        return
    with databases.embedded_server(prefix="keyturn-test-pg-") as url:
        yield url


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    """A database with every migration applied, copied for each test;
    dropped when the run ends (the server outlives runs when it is the
    machine's own PostgreSQL)."""
    name = f"keyturn_tpl_{os.getpid()}"
    asyncio.run(databases.create_migrated(server_url, name))
    yield name
    asyncio.run(databases.drop_database(server_url, name))


@pytest.fixture
async def database_url(server_url: str, template_db: str) -> AsyncIterator[str]:
    name = f"keyturn_t_{uuid.uuid4().hex[:12]}"
    url = await databases.create_database(server_url, name, template=template_db)
    yield url
    await databases.drop_database(server_url, name)


@pytest.fixture
async def server(database_url: str) -> AsyncIterator[InProcessServer]:
    async with serve_in_process(database_url) as srv:
        yield srv


@pytest.fixture
async def client(server: InProcessServer) -> AsyncIterator[GraphQLClient]:
    c = GraphQLClient(server.url)
    yield c
    await c.close()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[object]:
    """A plain asyncpg connection to the test's database, for checking the record."""
    conn = await admin(database_url)
    yield conn
    await conn.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a worker of a parallel run (pytest-xdist), hand this process's
    figures to the one that prints them."""
    from tests import figures

    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["figures"] = figures.exported()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """A worker of a parallel run finished: its figures join the run's."""
    from tests import figures

    exported = getattr(node, "workeroutput", {}).get("figures")
    if exported:
        figures.merge(exported)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What the run exercised: faults injected, turns lost, fuzz inputs tried."""
    from tests import figures

    if figures.FIGURES or figures.WORST:
        terminalreporter.section("figures exercised")
        for line in figures.summary():
            terminalreporter.write_line(line)
