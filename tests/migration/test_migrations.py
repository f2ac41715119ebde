"""The migrations against a real PostgreSQL: they build exactly the tables the
code declares, every one of them can be undone, and the database itself
refuses a status or an event type the code does not know."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text

from keyturn.db.engine import Engine, create_engine
from keyturn.db.migrate import (
    alembic_config,
    alembic_connection,
    current_revision,
    head_revision,
    upgrade,
)
from keyturn.db.tables import metadata
from keyturn.domain import EventType, TurnStatus
from keyturn.ops import databases

# -- helpers -------------------------------------------------------------------


@pytest.fixture
async def empty_engine(server_url: str) -> AsyncIterator[Engine]:
    """An engine on a new, empty database (no migration applied), dropped afterwards."""
    async with databases.throwaway(server_url, prefix="keyturn_mig") as url:
        engine = create_engine(url, pool_size=1)
        try:
            yield engine
        finally:
            await engine.dispose()


async def in_transaction(engine: Engine, step: Callable[[Connection], Any]) -> Any:
    """Run ``step`` on a sync connection inside one real transaction, the way
    keyturn.db.migrate runs the upgrade."""
    async with alembic_connection(engine) as conn, conn.begin():
        return await conn.run_sync(step)


def schema_diff(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(
        connection, opts={"compare_type": True, "compare_server_default": True}
    )
    return list(compare_metadata(context, metadata))


def revisions_base_to_head() -> list[str]:
    script = ScriptDirectory.from_config(alembic_config())
    newest_first = [rev.revision for rev in script.walk_revisions("base", "heads")]
    return list(reversed(newest_first))


# Everything a migration can change that the application relies on.
_SNAPSHOT_QUERIES = {
    "tables": """
        SELECT table_name FROM information_schema.tables
        WHERE table_schema = 'public' AND table_name <> 'alembic_version'""",
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '')
        FROM information_schema.columns
        WHERE table_schema = 'public' AND table_name <> 'alembic_version'""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'public' AND tablename <> 'alembic_version'""",
    "constraints": """
        SELECT c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c
        JOIN pg_class t ON t.oid = c.conrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = 'public' AND t.relname <> 'alembic_version'""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public'""",
}


Snapshot = dict[str, frozenset[tuple[Any, ...]]]


def catalog_snapshot(connection: Connection) -> Snapshot:
    return {
        name: frozenset(tuple(row) for row in connection.execute(text(sql)))
        for name, sql in _SNAPSHOT_QUERIES.items()
    }


def snapshot_difference(before: Snapshot, after: Snapshot) -> str:
    lines = []
    for name in before:
        for row in sorted(before[name] - after[name], key=repr):
            lines.append(f"{name}: lost {row}")
        for row in sorted(after[name] - before[name], key=repr):
            lines.append(f"{name}: gained {row}")
    return "\n".join(lines)


async def recorded_versions(engine: Engine) -> list[str]:
    """The rows of alembic_version: the revision the database says it is at."""

    def read(connection: Connection) -> list[str]:
        return [
            row[0] for row in connection.execute(text("SELECT version_num FROM alembic_version"))
        ]

    async with alembic_connection(engine) as conn:
        return await conn.run_sync(read)


async def keyturn_tables(engine: Engine) -> set[str]:
    def read(connection: Connection) -> set[str]:
        return {row[0] for row in connection.execute(text(_SNAPSHOT_QUERIES["tables"]))}

    async with alembic_connection(engine) as conn:
        return await conn.run_sync(read)


# -- the tables the code declares are the tables the migrations build ----------


async def test_a_database_migrated_to_head_matches_the_declared_tables(
    empty_engine: Engine,
) -> None:
    await upgrade(empty_engine)
    assert await current_revision(empty_engine) == head_revision()

    async with alembic_connection(empty_engine) as conn:
        diff = await conn.run_sync(schema_diff)

    listing = "\n".join(f"  {entry!r}" for entry in diff)
    assert diff == [], (
        "keyturn/db/tables.py and the migrations disagree; write a migration "
        f"(alembic revision --autogenerate) for:\n{listing}"
    )


# -- every migration can be applied and undone ---------------------------------


async def test_every_migration_upgrades_and_downgrades_one_step_at_a_time(
    empty_engine: Engine,
) -> None:
    revisions = revisions_base_to_head()
    assert revisions[:4] == ["0001", "0002", "0003", "0004"]
    assert revisions[-1] == head_revision()
    below: list[str | None] = [None, *revisions[:-1]]

    def upgrade_to(rev: str) -> Callable[[Connection], Any]:
        def step(connection: Connection) -> Any:
            command.upgrade(alembic_config(connection), rev)
            return catalog_snapshot(connection)

        return step

    def downgrade_to(rev: str) -> Callable[[Connection], Any]:
        def step(connection: Connection) -> Any:
            command.downgrade(alembic_config(connection), rev)
            return catalog_snapshot(connection)

        return step

    # What each revision leaves behind, None standing for base (an empty database).
    schema_at: dict[str | None, Snapshot] = {
        None: await in_transaction(empty_engine, catalog_snapshot)
    }
    assert await keyturn_tables(empty_engine) == set()

    # Up, one revision at a time.
    for previous, rev in zip(below, revisions, strict=True):
        schema_at[rev] = await in_transaction(empty_engine, upgrade_to(rev))
        assert await recorded_versions(empty_engine) == [rev]
        assert schema_at[rev] != schema_at[previous], f"migration {rev} changed nothing"

    # Down again: each downgrade restores exactly what the revision below built.
    for previous, rev in reversed(list(zip(below, revisions, strict=True))):
        snapshot = await in_transaction(empty_engine, downgrade_to(previous or "base"))
        assert await recorded_versions(empty_engine) == ([previous] if previous else [])
        assert snapshot == schema_at[previous], (
            f"downgrading {rev} did not restore the schema of {previous or 'base'}:\n"
            + snapshot_difference(schema_at[previous], snapshot)
        )
    assert await keyturn_tables(empty_engine) == set()

    # A database that was downgraded accepts a new upgrade, to the same schema.
    await upgrade(empty_engine)
    assert await recorded_versions(empty_engine) == [head_revision()]
    async with alembic_connection(empty_engine) as conn:
        assert await conn.run_sync(schema_diff) == []
        assert await conn.run_sync(catalog_snapshot) == schema_at[revisions[-1]]


# -- the database refuses what the code does not know --------------------------

_LITERAL = re.compile(r"'((?:[^']|'')*)'")


async def check_literals(db: Any, name: str) -> set[str]:
    definition = await db.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = $1", name
    )
    assert definition is not None, f"no constraint {name} in the migrated database"
    return {value.replace("''", "'") for value in _LITERAL.findall(definition)}


async def test_the_turn_status_check_names_exactly_the_known_statuses(db: Any) -> None:
    assert await check_literals(db, "ck_turns_status_known") == {s.value for s in TurnStatus}


async def test_the_event_type_check_names_exactly_the_known_event_types(db: Any) -> None:
    assert await check_literals(db, "ck_events_type_known") == {t.value for t in EventType}


async def new_session(db: Any) -> uuid.UUID:
    sid = uuid.uuid4()
    await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'FULL')", sid)
    return sid


INSERT_EVENT = "INSERT INTO events (session_id, seq, type, data) VALUES ($1, $2, $3, '{}'::jsonb)"


async def test_the_database_refuses_an_event_type_the_code_does_not_know(db: Any) -> None:
    sid = await new_session(db)
    await db.execute(INSERT_EVENT, sid, 1, EventType.TURN_STARTED.value)

    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await db.execute(INSERT_EVENT, sid, 2, "turn.nonsense")

    assert refused.value.constraint_name == "ck_events_type_known"
    stored = await db.fetch("SELECT seq, type FROM events WHERE session_id = $1 ORDER BY seq", sid)
    assert [tuple(r) for r in stored] == [(1, "turn.started")]


INSERT_TURN = """
    INSERT INTO turns (id, session_id, idempotency_key, input, history, fingerprint,
                       status, admit_seq)
    VALUES ($1, $2, $3, 'hello', 'FULL', 'f', $4, $5)"""


async def test_the_database_refuses_a_turn_status_the_code_does_not_know(db: Any) -> None:
    sid = await new_session(db)
    await db.execute(INSERT_TURN, uuid.uuid4(), sid, "k1", TurnStatus.QUEUED.value, 1)

    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await db.execute(INSERT_TURN, uuid.uuid4(), sid, "k2", "PAUSED", 2)

    assert refused.value.constraint_name == "ck_turns_status_known"
    statuses = await db.fetch("SELECT status FROM turns WHERE session_id = $1", sid)
    assert [r["status"] for r in statuses] == ["QUEUED"]
