"""`keyturn serve` as a newcomer runs it: no configuration, the embedded PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from keyturn.db.migrate import head_revision
from tests.support import GraphQLClient, admin, start_server_process, stop_process, with_database

pytestmark = pytest.mark.slow


def postgres_running(data_dir: Path) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "postgres" and str(data_dir) in " ".join(p.info["cmdline"] or [])
    ]


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Outside pytest's private temporary tree (see conftest.server_url).
    path = Path(tempfile.mkdtemp(prefix="keyturn-cli-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_serve_with_no_database_configured_uses_embedded_postgres_and_keeps_data(
    data_dir: Path,
) -> None:
    first = start_server_process(None, data_dir, name="embedded-1")
    try:
        client = GraphQLClient(first.url)
        sid = await client.create_session()
        accepted = await client.submit(sid, "k", "hello")
        await client.wait_for_status(accepted["turn"]["id"], {"COMPLETED"})
        await client.close()
    finally:
        stop_process(first)
    assert "embedded PostgreSQL" in first.log()
    # A clean stop stops the embedded server too: nothing is left running.
    assert postgres_running(data_dir) == []
    assert (data_dir / ".keyturn" / "pgdata" / "PG_VERSION").exists()

    second = start_server_process(None, data_dir, name="embedded-2")
    try:
        client = GraphQLClient(second.url)
        replay = await client.submit(sid, "k", "hello")
        assert replay["__typename"] == "TurnReplayed"
        assert replay["turn"]["id"] == accepted["turn"]["id"]
        await client.close()
    finally:
        stop_process(second)


def test_db_upgrade_and_current(database_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYTURN_")}
    env["KEYTURN_DATABASE_URL"] = database_url
    run = [sys.executable, "-m", "keyturn", "db"]
    up = subprocess.run(
        [*run, "upgrade"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert up.returncode == 0, up.stderr
    cur = subprocess.run(
        [*run, "current"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert cur.returncode == 0, cur.stderr
    assert f"revision {head_revision()}: up to date" in cur.stdout


async def test_processes_migrating_at_once_take_turns(server_url: str, tmp_path: Path) -> None:
    """Three `keyturn db upgrade` at the same moment on an empty database: the
    advisory lock serialises them, the first migrates, the others find nothing
    left to do."""
    name = f"keyturn_m_{uuid.uuid4().hex[:12]}"
    conn = await admin(server_url)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    url = with_database(server_url, name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYTURN_")}
    env["KEYTURN_DATABASE_URL"] = url
    try:
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "keyturn",
                "db",
                "upgrade",
                env=env,
                cwd=tmp_path,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for _ in range(3)
        ]
        for p in procs:
            _out, err = await asyncio.wait_for(p.communicate(), 120)
            assert p.returncode == 0, err.decode()
        check = await admin(url)
        try:
            assert await check.fetchval("SELECT version_num FROM alembic_version") == (
                head_revision()
            )
            assert await check.fetchval("SELECT count(*) FROM alembic_version") == 1
        finally:
            await check.close()
    finally:
        conn = await admin(server_url)
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


async def test_a_start_after_a_killed_serve_adopts_the_embedded_server_and_stops_it(
    data_dir: Path,
) -> None:
    """SIGKILL leaves the embedded PostgreSQL running and its holder listed:
    the next start adopts it, and its clean stop is the last one out."""
    killed = start_server_process(None, data_dir, name="killed")
    killed.proc.kill()
    killed.proc.wait()
    left = postgres_running(data_dir)
    assert left != []  # nobody stopped it

    adopter = start_server_process(None, data_dir, name="adopter")
    try:
        client = GraphQLClient(adopter.url)
        sid = await client.create_session()
        accepted = await client.submit(sid, "k", "after the kill")
        await client.wait_for_status(accepted["turn"]["id"], {"COMPLETED"})
        await client.close()
        # The same server, adopted rather than started again.
        assert set(postgres_running(data_dir)) >= set(left[:1])
    finally:
        stop_process(adopter)
        left_over = postgres_running(data_dir)
        for pid in left_over:  # not to outlive a failed run
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
    assert left_over == []
