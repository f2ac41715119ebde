"""A worker's write commits and its answer is lost: the record never says
otherwise than what happened. The proxy forwards the statement, lets
PostgreSQL commit, drops the answer and closes the connection; the worker
settles the unknown outcome from the record instead of writing again blindly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from sqlalchemy.engine import make_url

from keyturn.db import approvals, deltas, leases, ledger
from keyturn.db.engine import asyncpg_dsn, create_engine
from keyturn.db.records import turn_from
from keyturn.domain import ToolCallState
from keyturn.ops import databases
from keyturn.runtime.bus import EventBus
from keyturn.runtime.crash import CrashHook
from keyturn.runtime.model import FixtureModel
from keyturn.runtime.tool_runner import ToolRunner
from keyturn.runtime.tools import synthetic_tools
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


async def store(direct: str, key: str) -> list[bool]:
    """Whether each write the synthetic store holds under ``key`` applied."""
    conn: Any = await asyncpg.connect(asyncpg_dsn(direct))
    try:
        rows = await conn.fetch(
            "SELECT applied FROM synthetic_effects WHERE effect_key = $1 ORDER BY id", key
        )
        return [r["applied"] for r in rows]
    finally:
        await conn.close()


async def contradictions(direct: str, turn_id: str) -> list[str]:
    """What the record says against itself about one turn: a ledger entry
    twice, a refusal of a write under the turn's own epoch, a running turn
    interrupted without having run, a call whose state its events deny."""
    conn: Any = await asyncpg.connect(asyncpg_dsn(direct))
    try:
        events = await conn.fetch(
            "SELECT type, data FROM events WHERE turn_id = $1::uuid ORDER BY seq", turn_id
        )
        status = await conn.fetchval("SELECT status FROM turns WHERE id = $1::uuid", turn_id)
    finally:
        await conn.close()
    found: list[str] = []
    entries = [
        (e["type"], orjson.loads(e["data"]).get("index"), orjson.loads(e["data"]).get("epoch"))
        for e in events
        if e["type"].startswith("tool.")
    ]
    found += [f"twice: {entry}" for entry in set(entries) if entries.count(entry) > 1]
    for e in events:
        data = orjson.loads(e["data"])
        if e["type"] == "turn.write_refused" and data["staleEpoch"] == data["currentEpoch"]:
            found.append(f"refused under its own epoch: {data}")
    types = [e["type"] for e in events]
    for n, t in enumerate(types[:-1]):
        if t == "turn.running" and types[n + 1] == "turn.interrupted":
            found.append("interrupted without having run")
    results = {orjson.loads(e["data"])["index"] for e in events if e["type"] == "tool.result"}
    intents = {orjson.loads(e["data"])["index"] for e in events if e["type"] == "tool.intent"}
    if status == "COMPLETED" and intents - results:
        found.append(f"COMPLETED with calls that have no result: {sorted(intents - results)}")
    return found


async def take_over(direct: str, turn_id: str) -> None:
    """The running process loses the turn: its renewal is refused (the epoch
    moved on) and the lease is past, so the next sweep interrupts it."""
    conn: Any = await asyncpg.connect(asyncpg_dsn(direct))
    try:
        await conn.execute(
            "UPDATE turns SET epoch = epoch + 1, lease_until = now() - interval '1 second' "
            "WHERE id = $1::uuid",
            turn_id,
        )
    finally:
        await conn.close()


async def held_at(direct: str, turn_id: str, event_count: int, within: float = 10) -> None:
    """Wait until the turn has ``event_count`` events (it holds at a crash point)."""
    deadline = asyncio.get_running_loop().time() + within
    while len(await event_types(direct, turn_id)) < event_count:
        assert asyncio.get_running_loop().time() < deadline, await event_types(direct, turn_id)
        await asyncio.sleep(0.02)


async def worker_idle(srv: InProcessServer, within: float = 20) -> None:
    """Wait until the worker has no turn in hand (its last writes are done)."""
    worker = srv.app.state.runtime.worker
    deadline = asyncio.get_running_loop().time() + within
    while worker.running_count:
        assert asyncio.get_running_loop().time() < deadline, "the worker kept a turn"
        await asyncio.sleep(0.05)


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


# The worker's writes around one tool call, each cut after it committed. The
# same input runs first without a cut: the cut turn must end the same way.
WRITES = [
    ("tool.planned append", ledger._APPEND_RUNNING.sql, b"tool.planned", "/write a=1"),
    ("tool.intent append", ledger._APPEND_RUNNING.sql, b"tool.intent", "/write a=1"),
    ("tool.result append", ledger._APPEND_RUNNING.sql, b"tool.result", "/write a=1"),
    # Renewed every 0.5 s: the reply takes 1.5 s after its call.
    ("lease renewal", leases._RENEW.sql, b"", "/sleep 1500 /write a=1"),
]


@pytest.mark.parametrize(
    ("statement", "marker", "bound", "input"), WRITES, ids=[w[0] for w in WRITES]
)
async def test_a_worker_write_whose_answer_was_lost_leaves_the_turn_as_without_the_cut(
    proxied: Callable[..., AbstractAsyncContextManager[Proxied]],
    statement: str,
    marker: str,
    bound: bytes,
    input: str,
) -> None:
    async with proxied() as (srv, proxy, direct):
        client = GraphQLClient(srv.url)
        plain = await client.create_session()
        uncut = (await client.submit(plain, "u", input))["turn"]["id"]
        await client.wait_for_status(uncut, {"COMPLETED"}, 30)
        await worker_idle(srv)
        expected = await event_types(direct, uncut)

        sid = await client.create_session()
        proxy.cut_after(marker, bound=bound)
        tid = (await client.submit(sid, "c", input))["turn"]["id"]
        done = await client.wait_for_status(tid, {"COMPLETED", "INTERRUPTED", "FAILED"}, 30)
        await asyncio.wait_for(proxy.cut_done.wait(), 10)
        cut(statement)
        await worker_idle(srv)
        found = await contradictions(direct, tid)
        assert not judged(bool(found) or done["status"] != "COMPLETED"), (found, done)
        assert await event_types(direct, tid) == expected
        assert await store(direct, f"{tid}/0") == [True]
        calls = (await client.execute(CALLS, {"id": tid}))["turn"]["toolCalls"]
        assert [c["state"] for c in calls] == ["COMPLETED"]
        await client.close()


CALLS = """
query($id: ID!) { turn(id: $id) { status toolCalls { index state effectKey } } }
"""

RETRY = """
mutation($i: ResolveInterruptedTurnInput!) { resolveInterruptedTurn(input: $i) {
  __typename ... on TurnResolved { retry { id } }
} }
"""


async def settled(direct: str, turn_id: str, within: float = 20) -> list[str]:
    """The turn's events once INTERRUPTED with its idempotent call answered."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        types = await event_types(direct, turn_id)
        if "turn.interrupted" in types and "tool.reconciled" in types:
            return types
        assert asyncio.get_running_loop().time() < deadline, types
        await asyncio.sleep(0.05)


SETTLING = [
    # The sweep that interrupts the expired lease: an empty sweep passes.
    ("interrupting sweep", leases._INTERRUPT_EXPIRED.sql, True),
    ("tool.reconciled append", ledger._APPEND_RECONCILED.sql, False),
]


@pytest.mark.parametrize(("statement", "marker", "rows"), SETTLING, ids=[w[0] for w in SETTLING])
async def test_an_interruption_whose_answer_was_lost_is_settled_once_and_retried_once(
    proxied: Callable[..., AbstractAsyncContextManager[Proxied]],
    statement: str,
    marker: str,
    rows: bool,
) -> None:
    # The call holds after its intent (as if its process hung there); another
    # owner takes the turn, so this process's sweep interrupts it and asks
    # the tool about the unknown call.
    async with proxied(crash_at="after_intent:0", crash_after=1_000_000) as (srv, proxy, direct):
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        tid = (await client.submit(sid, "w", "/write a=1"))["turn"]["id"]
        await held_at(direct, tid, 4)  # started, running, planned, intent
        proxy.cut_after(marker, rows=rows)
        await take_over(direct, tid)
        await asyncio.wait_for(proxy.cut_done.wait(), 10)
        cut(statement)
        types = await settled(direct, tid)
        found = await contradictions(direct, tid)
        assert not judged(bool(found) or types.count("tool.reconciled") != 1), (found, types)
        assert types.count("turn.interrupted") == 1, types
        calls = (await client.execute(CALLS, {"id": tid}))["turn"]["toolCalls"]
        assert [c["state"] for c in calls] == ["RECONCILED_NOT_APPLIED"]
        # Asking settled the key as never applied.
        assert await store(direct, f"{tid}/0") == [False]
        await client.close()


async def test_an_approval_wait_whose_answer_was_lost_waits_once(
    proxied: Callable[..., AbstractAsyncContextManager[Proxied]],
) -> None:
    async with proxied(approve_unsafe=True) as (srv, proxy, direct):
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        proxy.cut_after(approvals._REQUEST.sql)
        tid = (await client.submit(sid, "a", "/append x=1"))["turn"]["id"]
        await client.wait_for_status(tid, {"WAITING", "INTERRUPTED", "FAILED"}, 30)
        await asyncio.wait_for(proxy.cut_done.wait(), 10)
        cut("approval wait")
        await worker_idle(srv)
        types = await event_types(direct, tid)
        found = await contradictions(direct, tid)
        assert not judged(bool(found) or types.count("tool.approval_requested") != 1), (
            found,
            types,
        )
        assert "turn.write_refused" not in types, types
        decided = await client.execute(
            DECIDE,
            {"i": {"turnId": tid, "index": 0, "decision": "APPROVE", "idempotencyKey": "yes"}},
        )
        assert decided["decideToolCall"]["__typename"] == "ToolCallDecided", decided
        done = await client.wait_for_status(tid, {"COMPLETED", "INTERRUPTED", "FAILED"}, 30)
        assert done["status"] == "COMPLETED", done
        await worker_idle(srv)
        assert await contradictions(direct, tid) == []
        assert await store(direct, f"{tid}/0") == [True]
        await client.close()


DECIDE = """
mutation($i: DecideToolCallInput!) { decideToolCall(input: $i) { __typename } }
"""


async def test_a_hand_back_whose_answer_was_lost_is_known_as_handed_back(
    proxied: Callable[..., AbstractAsyncContextManager[Proxied]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A clean stop past its grace hands a turn that did nothing outside
    # itself back to the queue; the next process runs it.
    async with proxied(shutdown_grace_s=0.3) as (srv, proxy, direct):
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        tid = (await client.submit(sid, "h", "/sleep 2000"))["turn"]["id"]
        await client.wait_for_status(tid, {"RUNNING"}, 30)
        proxy.cut_after(leases._RELEASE.sql)
        await client.close()
        caplog.set_level("INFO", logger="keyturn.runtime.worker")
    assert proxy.cut_done.is_set(), "the proxy did not cut"
    cut("release")
    types = await event_types(direct, tid)
    assert not judged(types != ["turn.started", "turn.running", "turn.released"]), types
    said = [r.getMessage() for r in caplog.records if r.name == "keyturn.runtime.worker"]
    assert any("handed back to the queue" in m for m in said), said
    assert not any("could not hand back" in m for m in said), said
    async with serve_in_process(direct, fast_settings()) as again:
        client = GraphQLClient(again.url)
        done = await client.wait_for_status(tid, {"COMPLETED", "INTERRUPTED", "FAILED"}, 30)
        assert done["status"] == "COMPLETED", done
        await client.close()
    assert await contradictions(direct, tid) == []


async def test_a_retrys_own_settlement_whose_answer_was_lost_is_read_back(
    proxied: Callable[..., AbstractAsyncContextManager[Proxied]],
) -> None:
    # The original turn is interrupted while its store is locked, and the
    # process that interrupted it stops before its question is answered: the
    # retry is the one to ask, and its tool.reconciled's answer is lost.
    async with proxied(crash_at="after_intent:0", crash_after=1_000_000) as (srv, proxy, direct):
        client = GraphQLClient(srv.url)
        sid = await client.create_session()
        w = (await client.submit(sid, "w", "/write a=1"))["turn"]["id"]
        await held_at(direct, w, 4)
        blocker: Any = await asyncpg.connect(asyncpg_dsn(direct))
        try:
            lock = blocker.transaction()
            await lock.start()
            await blocker.execute("LOCK TABLE synthetic_effects IN ACCESS EXCLUSIVE MODE")
            await take_over(direct, w)
            await client.wait_for_status(w, {"INTERRUPTED"}, 30)
            await client.close()
            srv.server.should_exit = True  # its question is cancelled as it stops
            await asyncio.wait_for(srv.task, 30)
            await lock.rollback()
        finally:
            await blocker.close()
        assert "tool.reconciled" not in await event_types(direct, w)

        conn: Any = await asyncpg.connect(asyncpg_dsn(direct))
        try:
            original = turn_from(await conn.fetchrow("SELECT * FROM turns WHERE id = $1::uuid", w))
        finally:
            await conn.close()
        retry = dataclasses.replace(original, id=uuid.uuid4(), retry_of=original.id, epoch=1)
        engine = create_engine(proxy.url(make_url(direct).database or ""), pool_size=2)
        try:
            runner = ToolRunner(
                engine=engine,
                model=FixtureModel(),
                bus=EventBus(engine, poll_s=1.0),
                tools=synthetic_tools(engine),
                crash=CrashHook(),
                lease_ttl_s=3.0,
                owner="retry",
            )
            proxy.cut_after(ledger._APPEND_RECONCILED.sql)
            calls = await runner._previous_calls(retry)
        finally:
            await engine.dispose()
        assert proxy.cut_done.is_set(), "the proxy did not cut"
        cut("tool.reconciled append (a retry's)")
        types = await event_types(direct, w)
        assert not judged(types.count("tool.reconciled") != 1), types
        assert [c.state for c in calls.values()] == [ToolCallState.RECONCILED_NOT_APPLIED]
        assert await store(direct, f"{w}/0") == [False]


async def test_a_refusals_record_whose_answer_was_lost_is_recorded_once(
    proxied: Callable[..., AbstractAsyncContextManager[Proxied]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A call holds before its intent while its turn passes to a newer epoch
    # and is interrupted; let go, its intent is refused and the refusal is
    # recorded. No renewal comes in between (one a minute): a refused renewal
    # would abandon the held call before it wrote anything. The same input
    # runs first without a cut: the cut turn must end the same way.
    release = tmp_path / "release"
    caplog.set_level("WARNING", logger="keyturn.runtime.fenced")
    settings = {"lease_renew_s": 60.0, "hold_at": "before_intent:0", "hold_until": release}
    async with proxied(**settings) as (srv, proxy, direct):
        client = GraphQLClient(srv.url)

        async def refused(key: str) -> str:
            sid = await client.create_session()
            tid: str = (await client.submit(sid, key, "/write a=1"))["turn"]["id"]
            await held_at(direct, tid, 3)  # started, running, planned
            await take_over(direct, tid)
            await client.wait_for_status(tid, {"INTERRUPTED"}, 30)
            release.touch()
            await worker_idle(srv)  # the call left its hold and was refused
            release.unlink()  # the next turn's call holds again
            return tid

        uncut = await refused("u")
        expected = await event_types(direct, uncut)
        assert expected.count("turn.write_refused") == 1, expected

        proxy.cut_after(leases._REFUSED.sql)
        tid = await refused("c")
        assert proxy.cut_done.is_set(), "the proxy did not cut"
        cut("turn.write_refused append")
        # The refusal was sent again on a fresh connection after the cut, and
        # found there as already recorded.
        retried = [
            r.getMessage()
            for r in caplog.records
            if r.name == "keyturn.runtime.fenced" and tid in r.getMessage()
        ]
        assert any("recording tool.intent failed; will retry" in m for m in retried), retried
        assert any("tool.intent refused, epoch 1 is stale" in m for m in retried), retried
        types = await event_types(direct, tid)
        found = await contradictions(direct, tid)
        assert not judged(bool(found) or types.count("turn.write_refused") != 1), (found, types)
        assert types == expected, types
        conn: Any = await asyncpg.connect(asyncpg_dsn(direct))
        try:
            [data] = [
                orjson.loads(r["data"])
                for r in await conn.fetch(
                    "SELECT data FROM events WHERE turn_id = $1::uuid "
                    "AND type = 'turn.write_refused'",
                    tid,
                )
            ]
        finally:
            await conn.close()
        assert data == {
            "attempted": "tool.intent",
            "by": srv.app.state.runtime.worker.owner,
            "staleEpoch": 1,
            "currentEpoch": 2,
            "status": "INTERRUPTED",
        }, data
        states = [
            [c["state"] for c in (await client.execute(CALLS, {"id": t}))["turn"]["toolCalls"]]
            for t in (uncut, tid)
        ]
        assert states[0] == states[1], states
        # Refused before its intent: the tool never ran.
        assert await store(direct, f"{tid}/0") == []
        await client.close()
