"""Apply Alembic migrations, serialised across processes by an advisory lock.

Alembic runs on SQLAlchemy: it gets an engine of its own, made for one
migration and closed after it, never the runtime's pool (asyncpg's)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool

from keyturn.db.engine import Engine, connect, raw_connect, sqlalchemy_url
from keyturn.db.sql import Statement

_HERE = Path(__file__).parent / "migrations"
# Any constant will do; it only has to be the same in every Keyturn process.
_LOCK_KEY = 0x6B65797475726E  # "keyturn"
# Alembic's own table (its default name, in the search path's schema).
_VERSIONS = Statement("SELECT version_num FROM alembic_version")


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config(str(_HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(_HERE))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


@asynccontextmanager
async def alembic_connection(engine: Engine) -> AsyncIterator[AsyncConnection]:
    """A SQLAlchemy connection to the engine's database, for Alembic: on a
    one-off engine whose connection is made as the pool's are (the same URL
    translation) and closed at the end."""
    url = engine.url

    async def make() -> Any:
        return await raw_connect(url)

    alembic_engine = create_async_engine(
        sqlalchemy_url(url), async_creator=make, poolclass=NullPool
    )
    try:
        async with alembic_engine.connect() as conn:
            yield conn
    finally:
        await alembic_engine.dispose()


def _upgrade(connection: Connection) -> None:
    # Held until this transaction ends: two processes starting together take
    # turns, and the second finds nothing left to do.
    connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    command.upgrade(alembic_config(connection), "head")


async def upgrade(engine: Engine) -> None:
    # One transaction: the advisory lock is held to its end, and the DDL
    # commits or rolls back as one.
    async with alembic_connection(engine) as conn, conn.begin():
        await conn.run_sync(_upgrade)


async def current_revision(engine: Engine) -> str | None:
    """The revision the database records (None before the first migration),
    read on the pool: the readiness probe asks on every call."""
    async with connect(engine) as conn:
        try:
            rows = await _VERSIONS.fetch(conn)
        except asyncpg.UndefinedTableError:
            return None
    if len(rows) > 1:
        # What Alembic's get_current_revision refuses too; Keyturn's
        # migrations have one line of descent.
        raise RuntimeError("alembic_version records more than one head")
    return str(rows[0]["version_num"]) if rows else None
