"""Apply Alembic migrations, serialised across processes by an advisory lock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

_HERE = Path(__file__).parent / "migrations"
# Any constant will do; it only has to be the same in every Keyturn process.
_LOCK_KEY = 0x6B65797475726E  # "keyturn"


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config(str(_HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(_HERE))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _upgrade(connection: Connection) -> None:
    # Held until this transaction ends: two processes starting together take
    # turns, and the second finds nothing left to do.
    connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    command.upgrade(alembic_config(connection), "head")


def _current(connection: Connection) -> Any:
    return MigrationContext.configure(connection).get_current_revision()


async def upgrade(engine: AsyncEngine) -> None:
    # A real transaction, whatever the engine's default: the advisory lock is
    # held to its end, and the DDL commits or rolls back as one.
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="READ COMMITTED")
        async with conn.begin():
            await conn.run_sync(_upgrade)


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        rev = await conn.run_sync(_current)
    return str(rev) if rev is not None else None
