"""The statements whose cost must not grow with the record read through an
index: a page of events or of sessions is a keyset range read in order (no
sort of everything before it), the claim reads the queue's index, the sweep
the index of running leases, admission's lookup its keys.

Planned on a small seeded record with sequential and bitmap scans priced out
of reach, so each plan answers "is there an index this statement can read, in
the order it asks for", which is what a large record would otherwise find out
(``python -m bench.scale`` measures it on 1,000,000 events). On a small range
a bitmap read sorted afterwards is as cheap, and the planner may choose it;
what must not be missing is the ordered index read."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bench.scale import (
    execute_arguments,
    expire_leases,
    explain_pooled,
    queue_turns,
    seed_sessions,
)
from keyturn.db import admission, cancels, leases, planner, reads
from keyturn.db.engine import REQUEST_SETTINGS, WORKER_SETTINGS, Engine, connect, create_engine
from keyturn.db.sql import Statement
from keyturn.errors import DatabaseBusy
from keyturn.runtime.planner import keep_statistics

TABLES = {"sessions", "turns", "events", "session_keys", "key_tombstones"}


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def _plan(
    db: Any,
    stmt: Statement,
    *,
    run: bool = False,
    pool: dict[str, str] = REQUEST_SETTINGS,
    **params: Any,
) -> list[dict[str, Any]]:
    """The plan's nodes as the pool of these settings makes it (the
    requests' unless told: the worker's statements, ``keyturn.db.leases``,
    run on the worker's), and with ``run`` run too (EXPLAIN ANALYZE: each
    node's actual loops)."""
    options = "ANALYZE, FORMAT JSON" if run else "FORMAT JSON"
    raw = await explain_pooled(db, stmt, params, options, pool)
    return list(_nodes(json.loads(raw)[0]["Plan"]))


def _scans(nodes: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(node type, table, index) of every scan of a table of the record."""
    return {
        (n["Node Type"], n["Relation Name"], n.get("Index Name", ""))
        for n in nodes
        if n.get("Relation Name") in TABLES
    }


def _indexes(nodes: list[dict[str, Any]]) -> set[str]:
    return {n["Index Name"] for n in nodes if "Index Name" in n}


def _no_seq_scan(nodes: list[dict[str, Any]]) -> None:
    seq = {table for kind, table, _ in _scans(nodes) if kind == "Seq Scan"}
    assert not seq, f"sequential scan of {seq}: {_scans(nodes)}"


@pytest.fixture
async def record(db: Any) -> dict[str, Any]:
    """A long session, some short ones, a queue and expired leases; analyzed."""
    await seed_sessions(db, 1, 400)  # 2,000 events
    await seed_sessions(db, 40, 3, first=1)
    await queue_turns(db, 30, 2)
    await expire_leases(db, 5)
    await db.execute("ANALYZE")
    await db.execute("SET enable_seqscan = off")
    await db.execute("SET enable_bitmapscan = off")
    first = await db.fetchrow("SELECT id, created_at FROM sessions ORDER BY created_at, id")
    return {"long": first["id"], "after": (first["created_at"], first["id"])}


@pytest.mark.parametrize("lean", [False, True], ids=["whole", "lean"])
@pytest.mark.parametrize("after", [0, 1000, 1900])
async def test_a_session_read_with_its_page_of_events_reads_both_by_index(
    db: Any, record: dict[str, Any], after: int, lean: bool
) -> None:
    nodes = await _plan(
        db,
        reads._SESSION_WITH_LEAN_EVENTS if lean else reads._SESSION_WITH_EVENTS,
        id=record["long"],
        tenant="",
        after=after,
        limit=101,
    )
    _no_seq_scan(nodes)
    assert ("Index Scan", "events", "uq_events_session_id_seq") in _scans(nodes)
    assert ("Index Scan", "sessions", "pk_sessions") in _scans(nodes)
    assert not [n for n in nodes if n["Node Type"] == "Sort"], "the page sorts what it read"


@pytest.mark.parametrize("after", [0, 1000, 1900])
async def test_a_page_of_events_is_a_range_of_the_session_seq_index(
    db: Any, record: dict[str, Any], after: int
) -> None:
    nodes = await _plan(db, reads._EVENTS_AFTER, session_id=record["long"], after=after, limit=101)
    assert ("Index Scan", "events", "uq_events_session_id_seq") in _scans(nodes)
    assert not [n for n in nodes if n["Node Type"] == "Sort"], "the page sorts what it read"
    _no_seq_scan(nodes)

    nodes = await _plan(
        db, reads._EVENTS_BEFORE, session_id=record["long"], before=after + 1, limit=101
    )
    assert ("Index Scan", "events", "uq_events_session_id_seq") in _scans(nodes)
    assert not [n for n in nodes if n["Node Type"] == "Sort"]


async def test_pages_of_events_for_a_page_of_sessions_or_turns_are_ranges_of_an_index(
    db: Any, record: dict[str, Any]
) -> None:
    sessions = [r["id"] for r in await db.fetch("SELECT id FROM sessions LIMIT 20")]
    windows: list[tuple[Statement, dict[str, Any]]] = [
        (reads._RAW_EVENTS_AFTER_BATCH, {"after": 1000}),
        (reads._RAW_EVENTS_BEFORE_BATCH, {"before": 1000}),
    ]
    for stmt, window in windows:
        nodes = await _plan(db, stmt, ids=sessions, limit=6, **window)
        assert ("Index Scan", "events", "uq_events_session_id_seq") in _scans(nodes)
        _no_seq_scan(nodes)
    turns = [r["id"] for r in await db.fetch("SELECT id FROM turns LIMIT 20")]
    nodes = await _plan(db, reads._TURN_EVENT_PAGES, ids=turns, after=0, limit=6)
    assert ("Index Scan", "events", "ix_events_turn") in _scans(nodes)
    _no_seq_scan(nodes)


async def test_a_page_of_sessions_is_a_range_of_the_tenant_index(
    db: Any, record: dict[str, Any]
) -> None:
    # A cursor near the end of the list: the page reads from the cursor on,
    # not every session before it.
    listed = await db.fetch("SELECT created_at, id FROM sessions ORDER BY created_at, id")
    after_ts, after_id = listed[-5]
    nodes = await _plan(
        db,
        reads._SESSIONS_AFTER,
        run=True,
        tenant="",
        after_ts=after_ts,
        after_id=after_id,
        limit=101,
    )
    assert {table for _, table, _ in _scans(nodes)} == {"sessions"}
    assert {index for _, _, index in _scans(nodes)} == {"ix_sessions_tenant_created"}
    assert not [n for n in nodes if n["Node Type"] == "Sort"], "the page sorts what it read"
    assert _rows_read(nodes, "sessions") <= 5, f"read {_rows_read(nodes, 'sessions')} sessions"

    nodes = await _plan(db, reads._FIRST_SESSIONS, run=True, tenant="", limit=3)
    assert {index for _, _, index in _scans(nodes)} == {"ix_sessions_tenant_created"}
    assert _rows_read(nodes, "sessions") == 3


async def test_the_claim_reads_the_queue_index(db: Any, record: dict[str, Any]) -> None:
    nodes = await _plan(db, leases._CLAIM, pool=WORKER_SETTINGS, owner="w", ttl=10.0, limit=32)
    assert "ix_turns_queued" in _indexes(nodes)
    _no_seq_scan(nodes)


async def test_the_sweep_reads_the_index_of_running_leases(db: Any, record: dict[str, Any]) -> None:
    nodes = await _plan(db, leases._INTERRUPT_EXPIRED, pool=WORKER_SETTINGS, by="w")
    assert "ix_turns_running_lease" in _indexes(nodes)
    _no_seq_scan(nodes)


async def test_the_admission_lookup_reads_by_key(db: Any, record: dict[str, Any]) -> None:
    params = {"tenant": "", "session_id": record["long"], "key": "old-7", "key_retention_s": None}
    nodes = await _plan(db, admission._LOOKUP, **params)
    _no_seq_scan(nodes)
    row = await db.fetchrow(admission._LOOKUP.sql, *[params[n] for n in admission._LOOKUP.names])
    assert row["t_idempotency_key"] == "old-7" and isinstance(row["t_id"], uuid.UUID)


@pytest.mark.parametrize("key", ["old-7", "new-key"], ids=["replay", "new"])
async def test_a_replay_is_answered_without_reading_the_decisions_keys(
    db: Any, record: dict[str, Any], key: str
) -> None:
    """The lookup reads the keys decisions took (a cancel's, a resolution's)
    only when no turn holds the key: a replay is its session, its turn and
    the tombstone probe, nothing more."""
    params = {"tenant": "", "session_id": record["long"], "key": key, "key_retention_s": None}
    nodes = await _plan(db, admission._LOOKUP, run=True, **params)
    decisions = [n for n in nodes if n.get("Relation Name") == "session_keys"]
    assert len(decisions) == 1, nodes
    assert decisions[0]["Actual Loops"] == (0 if key == "old-7" else 1)


async def test_the_tool_calls_of_a_page_of_turns_are_read_through_the_turn_index(
    db: Any, record: dict[str, Any]
) -> None:
    turns = [r["id"] for r in await db.fetch("SELECT id FROM turns LIMIT 20")]
    nodes = await _plan(db, reads._TOOL_EVENTS_OF_TURNS, ids=turns)
    assert ("Index Scan", "events", "ix_events_turn") in _scans(nodes)
    _no_seq_scan(nodes)
    assert not [n for n in nodes if n["Node Type"] == "Sort"], "the index's order is re-sorted"
    # The turns' other events (their deltas) are dropped in the scan, never sent.
    [scan] = [n for n in nodes if n.get("Index Name") == "ix_events_turn"]
    assert "tool.%" in scan.get("Filter", "") + scan.get("Index Cond", ""), scan


# Sixteen sessions each run a turn and hold the oldest 300 queued turns
# behind it; 48 more hold 60 each, younger. The oldest queued turns are then
# all behind running ones, so the claim must look past them to the other
# sessions' heads.
_SESSIONS = """
INSERT INTO sessions (id, default_history, tenant, event_seq)
SELECT gen_random_uuid(), 'NONE', '', 0 FROM generate_series(1, 64);
"""
# Fifty ended turns of each session, before the rest of its record.
_ENDED = """
INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history, status,
                   admit_seq, created_at, completed_at)
SELECT gen_random_uuid(), s.id, 'done' || n, 'fp', 'done', 'NONE', 'COMPLETED', -n,
       now() - interval '5 hours', now() - interval '4 hours'
FROM sessions s, generate_series(1, 50) n;
"""
_QUEUE = """
WITH s AS (SELECT id, row_number() OVER (ORDER BY id) AS rn FROM sessions)
INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history, status,
                   admit_seq, created_at, started_at, owner, epoch, lease_until)
SELECT gen_random_uuid(), s.id, 'running', 'fp', 'running', 'NONE', 'RUNNING', 1,
       now() - interval '3 hours', now(), 'another-process', 1, now() + interval '1 hour'
FROM s WHERE rn <= 16;
WITH s AS (SELECT id, row_number() OVER (ORDER BY id) AS rn FROM sessions)
INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history, status,
                   admit_seq, created_at)
SELECT gen_random_uuid(), s.id, 'q' || n, 'fp', 'queued', 'NONE', 'QUEUED', 1 + n,
       CASE WHEN rn <= 16 THEN now() - interval '2 hours' + make_interval(secs => n)
            ELSE now() - interval '1 hour' + make_interval(mins => rn::int, secs => n) END
FROM s, generate_series(1, 300) n WHERE rn <= 16 OR n <= 60;
"""
_BLOCKED_QUEUE = _SESSIONS + _QUEUE


def _rows_read(nodes: list[dict[str, Any]], table: str) -> int:
    """Rows a run's scans of ``table`` read, kept or filtered out."""
    return sum(
        (int(n["Actual Rows"]) + int(n.get("Rows Removed by Filter", 0))) * int(n["Actual Loops"])
        for n in nodes
        if n.get("Relation Name") == table and "Scan" in n["Node Type"]
    )


@pytest.mark.parametrize("statistics", ["never-analyzed", "analyzed", "analyzed-when-idle"])
async def test_the_claim_reads_the_heads_of_a_long_queue_not_the_whole_of_it(
    db: Any, statistics: str
) -> None:
    """Run, not only planned: the rows the claim reads from turns stay near
    its candidates and the sessions with queued turns, whatever the queue's
    length and whether the table's statistics know of it (a burst into a
    table last analyzed when it was nearly empty, or when nothing was
    queued, is planned on those)."""
    await db.execute(_SESSIONS)
    await db.execute(_ENDED)
    if statistics == "analyzed-when-idle":
        await db.execute("ANALYZE turns")
    await db.execute(_QUEUE)
    if statistics == "analyzed":
        await db.execute("ANALYZE turns")
    queued = await db.fetchval("SELECT count(*) FROM turns WHERE status = 'QUEUED'")
    assert queued == 16 * 300 + 48 * 60
    expected = await db.fetch(
        "SELECT DISTINCT ON (session_id) id, session_id, created_at FROM turns"
        " WHERE status = 'QUEUED' AND session_id NOT IN"
        "   (SELECT session_id FROM turns WHERE status = 'RUNNING')"
        " ORDER BY session_id, admit_seq"
    )
    oldest_free_heads = {r["id"] for r in sorted(expected, key=lambda r: r["created_at"])[:16]}
    params = {"owner": "w", "ttl": 10.0, "limit": 16}
    args = [params[n] for n in leases._CLAIM.names]
    tx = db.transaction()
    await tx.start()
    try:
        raw = await explain_pooled(
            db, leases._CLAIM, params, "ANALYZE, FORMAT JSON", WORKER_SETTINGS
        )
    finally:
        await tx.rollback()
    tx = db.transaction()
    await tx.start()
    try:
        claimed = {r["id"] for r in await db.fetch(leases._CLAIM.sql, *args)}
    finally:
        await tx.rollback()
    assert claimed == oldest_free_heads
    read = _rows_read(list(_nodes(json.loads(raw)[0]["Plan"])), "turns")
    scans = [
        (n.get("Index Name"), n.get("Index Cond"), n["Actual Rows"], n["Actual Loops"])
        for n in _nodes(json.loads(raw)[0]["Plan"])
        if n.get("Relation Name") == "turns"
    ]
    assert read < 1_000, f"the claim read {read} rows of turns for a queue of {queued}: {scans}"


_PLURAL = {"history": "histories"}  # the batched form's array of each parameter


@pytest.mark.parametrize("analyzed", [False, True], ids=["never-analyzed", "analyzed"])
async def test_a_rejecting_admission_asks_whether_its_session_is_idle_of_the_session_alone(
    db: Any, analyzed: bool
) -> None:
    """Run, not only planned: under multitask REJECT, whether the session is
    idle (nothing of it queued, running or waiting) is read from the
    session's own entries of each status's index, whatever the queue's
    length or the session's ended turns."""
    await db.execute(_BLOCKED_QUEUE)
    idle = uuid.uuid4()
    await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'NONE')", idle)
    # 2,000 ended turns of the idle session.
    await db.execute(
        "INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history,"
        " status, admit_seq, completed_at)"
        " SELECT gen_random_uuid(), $1, 'done' || n, 'fp', 'x', 'NONE', 'COMPLETED', n, now()"
        " FROM generate_series(1, 2000) n",
        idle,
    )
    await db.execute(
        "UPDATE sessions s SET event_seq = t.last"
        " FROM (SELECT session_id, max(admit_seq) AS last FROM turns GROUP BY session_id) t"
        " WHERE s.id = t.session_id"
    )
    busy = await db.fetchval(
        "SELECT session_id FROM turns WHERE status = 'QUEUED' GROUP BY session_id"
        " ORDER BY count(*) DESC LIMIT 1"
    )
    if analyzed:
        await db.execute("ANALYZE")
    # The lone submission's form and the batched form (keyturn.db.admission).
    forms = (admission._ADMIT_ONE_IF_IDLE, admission._ADMIT_IF_IDLE)
    for (sid, admitted), form in itertools.product(((idle, True), (busy, False)), forms):
        turn_id = uuid.uuid4()
        one: dict[str, Any] = {
            "turn_id": turn_id,
            "session_id": sid,
            "tenant": "",
            "key": "new-key",
            "fingerprint": "fp",
            "input": "x",
            "history": "NONE",
            "data": "{}",
        }
        params = (
            one
            if form is admission._ADMIT_ONE_IF_IDLE
            else {_PLURAL.get(name, f"{name}s"): [value] for name, value in one.items()}
        )
        tx = db.transaction()
        await tx.start()
        try:
            raw = await explain_pooled(db, form, params, "ANALYZE, FORMAT JSON")
            written = await db.fetchval("SELECT count(*) FROM turns WHERE id = $1", turn_id)
        finally:
            await tx.rollback()
        assert written == (1 if admitted else 0)
        touched = _rows_read(list(_nodes(json.loads(raw)[0]["Plan"])), "turns")
        assert touched < 10, [
            (n.get("Index Name"), n["Actual Rows"], n.get("Rows Removed by Filter"))
            for n in _nodes(json.loads(raw)[0]["Plan"])
            if n.get("Relation Name") == "turns"
        ]


async def _kept_plan(
    engine: Engine, stmt: Statement, params: dict[str, Any], *, calls: int = 1
) -> list[dict[str, Any]]:
    """Run ``stmt`` ``calls`` times on the engine's one connection (it was
    prepared there already when none), then EXPLAIN ANALYZE the plan that
    connection keeps for it (the driver's prepared statement), with the same
    values, in a transaction rolled back."""
    async with connect(engine) as conn:
        for _ in range(calls):
            await stmt.fetch(conn, **params)
        name = await conn.driver.fetchval(
            "SELECT name FROM pg_prepared_statements WHERE statement = $1", stmt.sql
        )
        values = await execute_arguments(conn.driver, name, [params[n] for n in stmt.names])
        tx = conn.driver.transaction()
        await tx.start()
        try:
            raw = await conn.driver.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({values})"
            )
        finally:
            await tx.rollback()
    # The pool's connections decode JSON themselves.
    return list(_nodes(raw[0]["Plan"]))


async def _analyzed(db: Any, tables: list[str], times: int = 1) -> None:
    """Wait until each of ``tables`` was analyzed at least ``times`` times,
    by the statistics task or, had it come first, by autovacuum (the task
    then finds nothing to do, and the kept plans are made again all the
    same)."""
    deadline = time.monotonic() + 20
    query = (
        "SELECT count(*) FROM pg_stat_user_tables WHERE relname = ANY($1)"
        " AND analyze_count + autoanalyze_count >= $2"
    )
    while await db.fetchval(query, tables, times) < len(tables):
        assert time.monotonic() < deadline, await db.fetch(
            "SELECT relname, analyze_count, pg_relation_size(relid) / 8192 AS pages"
            " FROM pg_stat_user_tables WHERE relname = ANY($1)",
            tables,
        )
        await asyncio.sleep(0.1)


async def test_plans_kept_from_before_a_new_databases_first_statistics_are_made_again(
    database_url: str, db: Any
) -> None:
    """A pooled connection keeps its plans; on a new database, the ones made
    before any statistics read the whole of what they look in once the
    tables fill (the lookup every turn of its session, the worker's cancel
    check every turn). The process analyzes a table once it holds ten pages,
    and again each time it doubles (keyturn.runtime.planner); the kept
    plans are made again."""
    requests = create_engine(database_url, pool_size=1, server_settings=REQUEST_SETTINGS)
    work = create_engine(
        database_url, pool_size=1, per_tenant=False, server_settings=WORKER_SETTINGS
    )
    session = uuid.uuid4()
    lookup = {"tenant": "", "session_id": session, "key": "new-key", "key_retention_s": None}
    task = asyncio.create_task(keep_statistics(work, interval_s=0.1))
    try:
        assert await db.fetchval("SELECT reltuples FROM pg_class WHERE relname = 'turns'") < 0
        # Made on the empty tables, and kept: the worker's pool plans a
        # statement's first five calls for their values, then keeps one.
        await _kept_plan(requests, admission._LOOKUP, lookup)
        await _kept_plan(work, cancels._REQUESTED_OF, {"turn_ids": [uuid.uuid4()]}, calls=6)

        await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'NONE')", session)
        await seed_sessions(db, 40, 120)
        await db.execute(
            "INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history,"
            " status, admit_seq, completed_at)"
            " SELECT gen_random_uuid(), $1, 'done' || n, 'fp', 'x', 'NONE', 'COMPLETED', n, now()"
            " FROM generate_series(1, 500) n",
            session,
        )
        turn_ids = [r["id"] for r in await db.fetch("SELECT id FROM turns LIMIT 20")]
        await _analyzed(db, ["turns", "events", "session_keys"])

        nodes = await _kept_plan(requests, admission._LOOKUP, lookup)
        assert _rows_read(nodes, "turns") <= 1, _scans(nodes)
        nodes = await _kept_plan(work, cancels._REQUESTED_OF, {"turn_ids": turn_ids})
        _no_seq_scan(nodes)
        assert _rows_read(nodes, "turns") == 20

        # Three times the turns: analyzed again, and then left alone.
        await seed_sessions(db, 120, 120, first=41)
        await _analyzed(db, ["turns", "events"], times=2)
        await asyncio.sleep(0.5)  # five more looks
        assert (
            await db.fetchval(
                "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'turns'"
            )
            <= 2
        )
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await requests.dispose()
        await work.dispose()


async def test_a_finish_kept_from_a_small_table_reads_its_turns_by_id(
    db: Any, database_url: str
) -> None:
    """The finish's plan, kept from when each session held a few turns,
    still reads each finished turn by its id once sessions hold hundreds
    (before any new statistics): not every turn of every session."""
    work = create_engine(
        database_url, pool_size=1, per_tenant=False, server_settings=WORKER_SETTINGS
    )
    finish: dict[str, list[Any]] = {
        "turn_ids": [uuid.uuid4()],
        "epochs": [1],
        "statuses": ["COMPLETED"],
        "outputs": ["x"],
        "errors": [None],
        "types": ["turn.completed"],
        "datas": ["{}"],
        "deltas": [None],
    }
    try:
        await seed_sessions(db, 64, 8)
        await db.execute("ANALYZE")
        await _kept_plan(work, leases._FINISH, finish, calls=6)
        await seed_sessions(db, 64, 300, first=64)
        running = [
            r["id"]
            for r in await db.fetch(
                "SELECT DISTINCT ON (session_id) id FROM turns"
                " ORDER BY session_id, admit_seq DESC LIMIT 8"
            )
        ]
        await db.execute(
            "UPDATE turns SET status = 'RUNNING', epoch = 1, completed_at = NULL"
            " WHERE id = ANY($1)",
            running,
        )
        n = len(running)
        nodes = await _kept_plan(
            work,
            leases._FINISH,
            {
                **{k: v * n for k, v in finish.items() if k != "turn_ids"},
                "turn_ids": running,
            },
            calls=0,
        )
        assert _rows_read(nodes, "turns") <= 4 * n, _scans(nodes)
    finally:
        await work.dispose()


async def test_an_analyze_that_fails_is_tried_again_only_once_the_table_doubles(
    database_url: str, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement timeout on a large table, say: not an ANALYZE every
    second, but one more when the table has twice the rows again."""
    work = create_engine(
        database_url, pool_size=1, per_tenant=False, server_settings=WORKER_SETTINGS
    )
    tried: list[list[str]] = []

    async def times_out(_conn: Any, names: list[str]) -> None:
        tried.append(names)
        raise DatabaseBusy()

    monkeypatch.setattr(planner, "analyze", times_out)
    await seed_sessions(db, 40, 120)
    task = asyncio.create_task(keep_statistics(work, interval_s=0.05))
    try:
        deadline = time.monotonic() + 20
        while not tried:
            assert time.monotonic() < deadline, "no analyze was tried"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # ten more looks
        assert len(tried) == 1 and "turns" in tried[0], tried

        await seed_sessions(db, 120, 120, first=41)
        while len(tried) < 2:
            assert time.monotonic() < deadline + 20, "the doubled table was not tried again"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert len(tried) == 2 and "turns" in tried[1], tried
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await work.dispose()
