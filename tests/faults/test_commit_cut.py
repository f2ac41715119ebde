"""The connection dies while the admission commits: never answered as "not
created". Admission is one statement in autocommit, so its commit is the
implicit one at the end of that statement (the Sync of the extended
protocol): the proxy forwards it, lets PostgreSQL commit, and drops the answer.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from keyturn.db.engine import asyncpg_dsn
from keyturn.ops import databases
from tests import figures
from tests.faults.load import Load
from tests.faults.pg import CuttingProxy, PrivatePostgres, server_port
from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process

pytestmark = pytest.mark.slow

# The statement that admits a new key (keyturn.db.admission._ADMIT_ONE, or
# _ADMIT for keys that arrive together): both insert the turn.
ADMISSION = "INSERT INTO turns"


@pytest.fixture
async def proxied(
    private_pg: PrivatePostgres,
) -> AsyncIterator[tuple[InProcessServer, CuttingProxy, str]]:
    name = f"keyturn_c_{uuid.uuid4().hex[:12]}"
    direct = await databases.create_migrated(private_pg.url, name)
    proxy = CuttingProxy(private_pg.socket_dir, server_port(private_pg.url))
    await proxy.start()
    try:
        async with serve_in_process(proxy.url(name), fast_settings(pool_size=4)) as srv:
            yield srv, proxy, direct
    finally:
        await proxy.stop()


async def turns_with_key(direct: str, key: str) -> list[str]:
    conn: Any = await asyncpg.connect(asyncpg_dsn(direct))
    try:
        rows = await conn.fetch("SELECT id::text FROM turns WHERE idempotency_key = $1", key)
        return [r["id"] for r in rows]
    finally:
        await conn.close()


async def test_commit_answer_lost_is_settled_by_rereading_the_key(
    proxied: tuple[InProcessServer, CuttingProxy, str],
) -> None:
    srv, proxy, direct = proxied
    client = GraphQLClient(srv.url)
    sid = await client.create_session()
    load = Load(srv.url, sid)
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        for i in range(10):
            key = f"cut-{i}"
            proxy.cut_after(ADMISSION)
            result = await load.submit_once(http, key, f"input {i}")
            assert proxy.cut_done.is_set(), "the proxy did not cut"
            figures.add("faults injected")
            figures.add("faults: commit answer dropped")
            committed = await turns_with_key(direct, key)
            assert len(committed) == 1  # PostgreSQL did commit it
            # Settled on a fresh connection: the committed turn, accepted.
            assert result is not None and result["__typename"] == "TurnAccepted", load.answers
            assert result["turn"]["id"] == committed[0]
            load.acked[key] = committed[0]
            await client.wait_for_status(committed[0], {"COMPLETED"})
    assert proxy.cuts == 10
    await client.close()


async def test_commit_answer_lost_and_database_unreachable_is_a_retryable_error(
    proxied: tuple[InProcessServer, CuttingProxy, str],
) -> None:
    srv, proxy, direct = proxied
    client = GraphQLClient(srv.url)
    sid = await client.create_session()
    load = Load(srv.url, sid)
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        for i in range(5):
            key = f"cut-down-{i}"
            proxy.cut_after(ADMISSION, then_down=True)
            task = asyncio.create_task(load.submit_once(http, key, f"input {i}"))
            await proxy.cut_done.wait()
            result = await task
            figures.add("faults injected")
            figures.add("faults: commit answer dropped, database unreachable")
            # Not "not created", not a guess: a retryable error.
            assert result is None, result
            assert load.answers["error UNAVAILABLE"] == i + 1
            proxy.up()
            retried = await load.submit_once(http, key, f"input {i}")
            # Committed before the cut (the usual case here), so replayed;
            # had the commit not happened, a new turn. Never two.
            assert retried is not None, load.answers
            assert [retried["turn"]["id"]] == await turns_with_key(direct, key)
    await client.close()


async def test_commit_racing_the_cut_converges_on_one_turn(
    proxied: tuple[InProcessServer, CuttingProxy, str],
) -> None:
    """The connection closes right after the commit request, without waiting:
    the commit may or may not happen. Whatever the answer, a retry with the
    same key converges on exactly one turn."""
    srv, proxy, direct = proxied
    client = GraphQLClient(srv.url)
    sid = await client.create_session()
    load = Load(srv.url, sid)
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        for i in range(10):
            key = f"race-{i}"
            proxy.cut_after(ADMISSION, wait_for_reply=False)
            first = await load.submit_once(http, key, f"input {i}")
            figures.add("faults injected")
            figures.add("faults: connection closed racing the commit")
            turn_id = await load.submit_until_acknowledged(http, key, f"input {i}")
            if first is not None:
                assert first["turn"]["id"] == turn_id
            assert await turns_with_key(direct, key) == [turn_id]
    figures.add("turns acknowledged under faults", len(load.acked))
    print(f"racing cuts: {dict(load.answers)}")
    await client.close()
