"""A worker's write commits and its answer is lost: the record never says
otherwise than what happened. The proxy forwards the statement, lets
PostgreSQL commit, drops the answer and closes the connection; the worker
settles the unknown outcome from the record instead of writing again blindly.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import asyncpg
import pytest

from keyturn.db import deltas, leases, ledger
from keyturn.db.engine import asyncpg_dsn
from keyturn.ops import databases
from tests import figures
from tests.faults.pg import CuttingProxy, PrivatePostgres, server_port
from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process

pytestmark = pytest.mark.slow

Proxied = tuple[InProcessServer, CuttingProxy, str]


@pytest.fixture
def proxied(
    private_pg: PrivatePostgres,
) -> Callable[..., AbstractAsyncContextManager[Proxied]]:
    @asynccontextmanager
    async def start(**settings: Any) -> AsyncIterator[Proxied]:
        name = f"keyturn_a_{uuid.uuid4().hex[:12]}"
        direct = await databases.create_migrated(private_pg.url, name)
        proxy = CuttingProxy(private_pg.socket_dir, server_port(private_pg.url))
        await proxy.start()
        try:
            async with serve_in_process(
                proxy.url(name), fast_settings(pool_size=4, **settings)
            ) as srv:
                yield srv, proxy, direct
        finally:
            await proxy.stop()

    return start


def cut(statement: str) -> None:
    figures.add("faults injected")
    figures.add("commit answers cut")
    figures.add(f"commit answers cut: {statement}")


def judged(contradiction: bool) -> bool:
    """Count what the record says after a cut; the test then asserts it."""
    figures.add("contradictions found", int(contradiction))
    return contradiction


async def event_types(direct: str, turn_id: str) -> list[str]:
    conn: Any = await asyncpg.connect(asyncpg_dsn(direct))
    try:
        rows = await conn.fetch(
            "SELECT type FROM events WHERE turn_id = $1::uuid ORDER BY seq", turn_id
        )
        return [r["type"] for r in rows]
    finally:
        await conn.close()


async def worker_idle(srv: InProcessServer, within: float = 20) -> None:
    """Wait until the worker has no turn in hand (its last writes are done)."""
    worker = srv.app.state.runtime.worker
    deadline = asyncio.get_running_loop().time() + within
    while worker.running_count:
        assert asyncio.get_running_loop().time() < deadline, "the worker kept a turn"
        await asyncio.sleep(0.05)


async def test_a_plan_whose_answer_was_lost_is_recorded_once(
    proxied: Callable[..., AbstractAsyncContextManager[Proxied]],
) -> None:
    async with proxied() as (srv, proxy, direct):
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        # The first ledger append of this turn is its tool.planned.
        proxy.cut_after(ledger._APPEND_RUNNING.sql)
        tid = (await client.submit(sid, "w", "/write a=1"))["turn"]["id"]
        done = await client.wait_for_status(tid, {"COMPLETED", "INTERRUPTED", "FAILED"}, 30)
        assert proxy.cut_done.is_set(), "the proxy did not cut"
        cut("tool.planned append")
        assert done["status"] == "COMPLETED", done
        types = await event_types(direct, tid)
        assert not judged(types.count("tool.planned") != 1), types
        assert types.count("tool.intent") == types.count("tool.result") == 1, types
        await client.close()


async def test_a_finish_whose_answer_was_lost_is_not_recorded_as_refused(
    proxied: Callable[..., AbstractAsyncContextManager[Proxied]],
) -> None:
    async with proxied() as (srv, proxy, direct):
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        proxy.cut_after(leases._FINISH.sql)
        tid = (await client.submit(sid, "f", "hello"))["turn"]["id"]
        done = await client.wait_for_status(tid, {"COMPLETED", "INTERRUPTED", "FAILED"}, 30)
        await asyncio.wait_for(proxy.cut_done.wait(), 10)
        cut("finish")
        assert done["status"] == "COMPLETED", done
        # The retry found its own write: nothing more is recorded after the end.
        await worker_idle(srv)
        types = await event_types(direct, tid)
        assert not judged("turn.write_refused" in types), types
        assert types == ["turn.started", "turn.running", "turn.delta", "turn.completed"], types
        await client.close()


async def test_a_claim_whose_answer_was_lost_runs_its_turn(
    proxied: Callable[..., AbstractAsyncContextManager[Proxied]],
) -> None:
    # Claims only when woken (by the admission), so the cut hits the claim
    # that takes the turn, not an empty poll.
    async with proxied(claim_poll_s=30.0) as (srv, proxy, direct):
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        await asyncio.sleep(0.5)  # the first, empty, claim at start is done
        proxy.cut_after(leases._CLAIM.sql)
        tid = (await client.submit(sid, "c", "hello"))["turn"]["id"]
        await asyncio.wait_for(proxy.cut_done.wait(), 10)
        cut("claim")
        done = await client.wait_for_status(tid, {"COMPLETED", "INTERRUPTED", "FAILED"}, 30)
        assert not judged(done["status"] != "COMPLETED"), done
        await worker_idle(srv)
        types = await event_types(direct, tid)
        assert types == ["turn.started", "turn.running", "turn.delta", "turn.completed"], types
        assert done["output"]
        await client.close()


async def test_a_delta_whose_answer_was_lost_is_recorded_once(
    proxied: Callable[..., AbstractAsyncContextManager[Proxied]],
) -> None:
    async with proxied(delta_flush_ms=20) as (srv, proxy, direct):
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        proxy.cut_after(deltas._APPEND.sql)
        tid = (await client.submit(sid, "s", "/stream 4 300"))["turn"]["id"]
        done = await client.wait_for_status(tid, {"COMPLETED", "INTERRUPTED", "FAILED"}, 30)
        await asyncio.wait_for(proxy.cut_done.wait(), 10)
        cut("turn.delta append")
        assert done["status"] == "COMPLETED", done
        await worker_idle(srv)
        # The retry found its own delta: each index once, nothing refused, and
        # the pieces still make up the output.
        pieces = [e["data"] for e in done["events"] if e["type"] == "turn.delta"]
        assert not judged([p["index"] for p in pieces] != list(range(len(pieces)))), pieces
        assert "turn.write_refused" not in await event_types(direct, tid)
        assert "".join(p["text"] for p in pieces) == done["output"]
        await client.close()
