"""Fixtures for fault tests: a private PostgreSQL that may be restarted."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from keyturn.ops import databases
from tests.faults.pg import PrivatePostgres, private_postgres


@pytest.fixture(scope="session")
def private_pg() -> Iterator[PrivatePostgres]:
    with private_postgres() as pg:
        yield pg


@pytest.fixture
async def fault_db(private_pg: PrivatePostgres) -> AsyncIterator[str]:
    """A migrated database on the private server."""
    name = f"keyturn_f_{uuid.uuid4().hex[:12]}"
    yield await databases.create_migrated(private_pg.url, name)
