"""`keyturn serve` as a newcomer runs it: no configuration, the embedded PostgreSQL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from keyturn.db.migrate import head_revision
from tests.support import GraphQLClient, start_server_process, stop_process

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
