"""Throwaway databases: a fresh database on a server, copied from a migrated
template when many are needed, dropped afterwards; or a whole embedded
PostgreSQL in a temporary directory when no server is named.

Used by ``keyturn experiment``, the benchmark and the test suite, so that all
three make and drop databases the same way.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from keyturn.db.engine import create_engine, raw_connect, with_database
from keyturn.db.migrate import upgrade


async def admin_connect(url: str) -> Any:
    """A plain asyncpg connection (no pool) for administrative statements."""
    return await raw_connect(url)


async def admin_execute(url: str, *statements: str) -> None:
    conn = await admin_connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def create_database(server_url: str, name: str, *, template: str | None = None) -> str:
    """``CREATE DATABASE name [TEMPLATE template]`` on the server; its URL."""
    copy = f' TEMPLATE "{template}"' if template else ""
    await admin_execute(server_url, f'CREATE DATABASE "{name}"{copy}')
    return with_database(server_url, name)


async def drop_database(server_url: str, name: str) -> None:
    # FORCE: a server the caller killed may have left sessions behind.
    await admin_execute(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def create_migrated(server_url: str, name: str) -> str:
    """A new database with every migration applied (a template to copy)."""
    await drop_database(server_url, name)
    url = await create_database(server_url, name)
    await migrate(url)
    return url


async def migrate(url: str) -> None:
    """Apply every migration to the database at ``url``."""
    engine = create_engine(url, pool_size=1)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


def new_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def throwaway(
    server_url: str, *, prefix: str = "keyturn_tmp", template: str | None = None
) -> AsyncIterator[str]:
    """A new database (a copy of ``template`` when given), dropped on exit."""
    name = new_name(prefix)
    url = await create_database(server_url, name, template=template)
    try:
        yield url
    finally:
        with contextlib.suppress(Exception):
            await drop_database(server_url, name)


@contextlib.contextmanager
def embedded_server(prefix: str = "keyturn-pg-") -> Iterator[str]:
    """An embedded PostgreSQL in a new temporary directory, removed on exit.

    Not under pytest's private temporary tree: run as root, the embedded
    server is another user, who must be able to reach its data."""
    from keyturn.db import embedded

    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    url, handle = embedded.start(data_dir)
    try:
        yield url
    finally:
        with contextlib.suppress(Exception):
            handle.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)


@contextlib.contextmanager
def throwaway_database(
    base_url: str | None, *, prefix: str = "keyturn_tmp", template: str | None = None
) -> Iterator[str]:
    """A fresh database on ``base_url``'s server, or on an embedded PostgreSQL
    in a temporary directory when no URL is given; dropped afterwards. Empty,
    or a copy of ``template`` when given. For synchronous callers (commands,
    the benchmark)."""
    import asyncio

    with contextlib.ExitStack() as stack:
        server_url = base_url or stack.enter_context(embedded_server())
        name = new_name(prefix)
        url = asyncio.run(create_database(server_url, name, template=template))
        try:
            yield url
        finally:
            with contextlib.suppress(Exception):
                asyncio.run(drop_database(server_url, name))
