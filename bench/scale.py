"""The scale run: Keyturn on a record of 1,000,000 events and 200,000 turns
across 10,000 sessions, each operation as a ratio to the same operation on
an empty database in the same run (the target is at least 0.8 for each).

Two databases on one server, copies of one migrated template: the *record*,
seeded with bulk SQL (``INSERT … SELECT generate_series``, rows valid for the
schema: every turn's key in ``session_keys``, gapless seqs counted on their
sessions, known statuses and event types), and the *empty* one, holding only
what each operation needs (101 sessions, one of them 300 events long). The
record's sessions hold completed turns of five events each (started, running,
two deltas, completed); one of them holds 100,000 events.

Over HTTP, through one ``keyturn serve`` per database (one process):
admission (``submitTurn``, new keys, on 64 sessions of the record), replays
(the same keys again), a page of 100 events at the start, the middle and the
end of the long session, and ``sessions(first: 100)`` at the end of the list.
The servers take turns, empty, record, record, empty (``--rounds 2``), and
each operation keeps its best round. Then, with no server running, the
statements themselves as Keyturn runs them (imported from ``keyturn.db``),
each in a transaction rolled back so every run sees the same rows: the claim
with 10,000 turns queued across sessions (the empty database: as many as one
claim takes), and the sweep of expired leases (100 of them in both).

Every ratio below its target is EXPLAINed (ANALYZE, BUFFERS) on the record,
statement by statement, and the plans are printed and kept in the JSON.

python -m bench.scale [--sessions 10000] [--turns 200000] [--long-events 100000]
                      [--queued 10000] [--duration 4] [--rounds 2]
                      [--database auto|embedded|URL] [--out PATH]
prints the ratios with their verdicts and, with --out, writes them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import orjson

from bench import loadgen
from bench.admission import drain
from bench.load import replay_cycle, run_wrk, submit_load, summarize
from bench.reading import PAGE_QUERY, keyturn_cursor
from bench.rows import Measured, progress
from bench.servers import START_TIMEOUT_S, database_server, port_of, target_databases
from bench.sizes import Config, parse_args
from bench.targets import RATIO_FLOOR, Verdict, judge, line, ratio_target
from keyturn.db import admission as db_admission
from keyturn.db import leases
from keyturn.db import reads as db_reads
from keyturn.db.engine import REQUEST_SETTINGS, WORKER_SETTINGS, Conn
from keyturn.db.sql import Statement
from keyturn.ops.databases import admin_connect
from keyturn.ops.serverproc import start_server
from keyturn.resolvers.pagination import session_cursor

EVENTS_PER_TURN = 5  # turn.started, turn.running, two turn.delta, turn.completed
SMALL_EVENTS = 300  # the empty database's one session with events: three pages
CLAIM_LIMIT = 32  # what one claim asks for when the worker is idle (max_running_turns)
EXPIRED = 100  # expired leases in both databases: one sweep's batch
ADMISSION_SESSIONS = 64
CHUNK = 500  # sessions seeded per statement
OWNER = "bench-scale"

# The operations, in the order they are measured and printed.
OPS: tuple[tuple[str, str], ...] = (
    ("admit", "admission: submitTurn, new keys (64 sessions)"),
    ("replay", "replays: the same keys again"),
    ("page.start", "a page of 100 events at the start of the long session"),
    ("page.middle", "a page of 100 events in the middle of the long session"),
    ("page.end", "a page of 100 events at the end of the long session"),
    ("sessions.end", "sessions(first: 100) at the end of the list"),
    ("sweep", "the sweep for expired leases (100 expired)"),
    ("claim", "the claim, turns queued across sessions"),
)
LABELS = dict(OPS)

SESSIONS_QUERY = (
    "query($after: String) { sessions(first: 100, after: $after) { edges { cursor node "
    "{ id eventCount } } pageInfo { endCursor hasNextPage } } }"
)
JSON = {"Content-Type": "application/json"}

# Sessions of COMPLETED turns, five events each, their keys in session_keys;
# each session's created_at is one second after the previous one's, so the
# list's order (created_at, id) is the order they were seeded in.
_RECORD = """
WITH s AS (
    INSERT INTO sessions (id, default_history, tenant, event_seq, created_at)
    SELECT gen_random_uuid(), 'NONE', '', $2::bigint * 5,
           now() - interval '30 days' + make_interval(secs => i)
    FROM generate_series($3::int, $3::int + $1::int - 1) i
    RETURNING id, created_at
), t AS (
    INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history, status,
                       output, admit_seq, created_at, started_at, completed_at, owner, epoch)
    SELECT gen_random_uuid(), s.id, 'old-' || n, 'fp-' || n, 'input ' || n, 'NONE', 'COMPLETED',
           'output, in two pieces', 5 * n - 4, s.created_at + make_interval(secs => n),
           s.created_at + make_interval(secs => n), s.created_at + make_interval(secs => n + 1),
           'seed', 1
    FROM s, generate_series(1, $2::int) n
    RETURNING id, session_id, idempotency_key, admit_seq, created_at
), k AS (
    INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
    SELECT session_id, idempotency_key, 'TURN', id FROM t
)
INSERT INTO events (session_id, turn_id, seq, type, data, created_at)
SELECT t.session_id, t.id, t.admit_seq + k,
       (ARRAY['turn.started', 'turn.running', 'turn.delta', 'turn.delta', 'turn.completed'])[k + 1],
       CASE k
           WHEN 0 THEN jsonb_build_object('idempotencyKey', t.idempotency_key,
                                          'history', 'NONE', 'seq', t.admit_seq)
           WHEN 1 THEN jsonb_build_object('owner', 'seed', 'epoch', 1)
           WHEN 4 THEN jsonb_build_object('status', 'COMPLETED', 'epoch', 1,
                                          'output', 'output, in two pieces')
           ELSE jsonb_build_object('text', (ARRAY['output, ', 'in two pieces'])[k - 1],
                                   'index', k - 2, 'epoch', 1)
       END,
       t.created_at
FROM t, generate_series(0, 4) k
"""

# $2 QUEUED turns on each of the first $1 sessions (in list order), after
# what each holds: turn.started appended, the counter bumped, the key taken.
_QUEUED = """
WITH s AS (
    SELECT id, event_seq FROM sessions ORDER BY created_at, id LIMIT $1
), t AS (
    INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history, status,
                       admit_seq, created_at)
    SELECT gen_random_uuid(), s.id, 'queued-' || n, 'fpq-' || n, 'queued ' || n, 'NONE',
           'QUEUED', s.event_seq + n,
           now() - interval '1 hour' + make_interval(secs => n * 60 + random() * 50)
    FROM s, generate_series(1, $2::int) n
    RETURNING id, session_id, idempotency_key, admit_seq
), k AS (
    INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
    SELECT session_id, idempotency_key, 'TURN', id FROM t
), bump AS (
    UPDATE sessions SET event_seq = sessions.event_seq + $2::int
    FROM s WHERE sessions.id = s.id
)
INSERT INTO events (session_id, turn_id, seq, type, data)
SELECT session_id, id, admit_seq, 'turn.started',
       jsonb_build_object('idempotencyKey', idempotency_key, 'history', 'NONE', 'seq', admit_seq)
FROM t
"""

# $1 new sessions, each with a RUNNING turn whose lease ran out a minute ago
# (its owner stopped renewing it): turn.started and turn.running recorded.
_EXPIRED = """
WITH s AS (
    INSERT INTO sessions (id, default_history, tenant, event_seq)
    SELECT gen_random_uuid(), 'NONE', '', 2 FROM generate_series(1, $1::int)
    RETURNING id
), t AS (
    INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history, status,
                       admit_seq, created_at, started_at, owner, epoch, lease_until)
    SELECT gen_random_uuid(), s.id, 'running-1', 'fpr-1', 'running', 'NONE', 'RUNNING', 1,
           now() - interval '5 minutes', now() - interval '5 minutes', 'a-stopped-process', 1,
           now() - interval '1 minute'
    FROM s
    RETURNING id, session_id, idempotency_key
), k AS (
    INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
    SELECT session_id, idempotency_key, 'TURN', id FROM t
)
INSERT INTO events (session_id, turn_id, seq, type, data)
SELECT session_id, id, 1, 'turn.started',
       jsonb_build_object('idempotencyKey', idempotency_key, 'history', 'NONE', 'seq', 1)
FROM t
UNION ALL
SELECT session_id, id, 2, 'turn.running',
       jsonb_build_object('owner', 'a-stopped-process', 'epoch', 1)
FROM t
"""


async def seed_sessions(conn: Any, count: int, turns_per_session: int, first: int = 0) -> None:
    """``count`` sessions of ``turns_per_session`` completed turns, five
    events each; ``first`` places them in the list (one second apart)."""
    await conn.execute(_RECORD, count, turns_per_session, first)


async def queue_turns(conn: Any, sessions: int, per_session: int) -> None:
    """``per_session`` QUEUED turns on each of the list's first ``sessions``."""
    await conn.execute(_QUEUED, sessions, per_session)


async def expire_leases(conn: Any, count: int) -> None:
    """``count`` new sessions, each running a turn whose lease ran out."""
    await conn.execute(_EXPIRED, count)


@dataclass(frozen=True, slots=True)
class Shape:
    """What one database holds."""

    sessions: int  # including the long one
    turns_per_session: int
    long_turns: int  # the long session's (five events each)
    queued_sessions: int  # sessions given queued turns for the claim
    queued_per_session: int

    @property
    def long_events(self) -> int:
        return self.long_turns * EVENTS_PER_TURN

    @property
    def turns(self) -> int:
        return self.long_turns + (self.sessions - 1) * self.turns_per_session

    @property
    def queued(self) -> int:
        return self.queued_sessions * self.queued_per_session


def record_shape(args: argparse.Namespace) -> Shape:
    long_turns = args.long_events // EVENTS_PER_TURN
    rest = max(0, args.turns - long_turns)
    per_session = math.ceil(rest / max(1, args.sessions - 1))
    queued_sessions = min(args.sessions, args.queued)
    return Shape(
        args.sessions,
        per_session,
        long_turns,
        queued_sessions,
        math.ceil(args.queued / max(1, queued_sessions)),
    )


# The empty database: as many sessions as a page of the list needs after its
# first, no turns but the one short session's, one claim's worth of queue.
EMPTY = Shape(101, 0, SMALL_EVENTS // EVENTS_PER_TURN, CLAIM_LIMIT, 1)


class Place(TypedDict):
    """Where a database's operations point: the sessions admission writes to,
    the long session, and the cursors of the pages read."""

    sessions: list[str]
    long_session: str
    page_after: dict[str, int]  # page op → the seq its cursor names
    list_after: str  # the cursor just before the list's last 100 sessions


async def _seed(url: str, shape: Shape, name: str) -> Place:
    conn = await admin_connect(url)
    try:
        started = time.perf_counter()
        # The long session first: the list's first, and its own statement.
        await seed_sessions(conn, 1, shape.long_turns)
        done, chunks = 1, 0
        while done < shape.sessions:
            n = min(CHUNK, shape.sessions - done)
            await seed_sessions(conn, n, shape.turns_per_session, done)
            done, chunks = done + n, chunks + 1
            if chunks % 4 == 0 or done == shape.sessions:
                events = shape.long_events + (done - 1) * shape.turns_per_session * EVENTS_PER_TURN
                progress(
                    f"  {name}: {done:,} of {shape.sessions:,} sessions, {events:,} events "
                    f"({time.perf_counter() - started:.0f}s)"
                )
        progress(f"  {name}: VACUUM ANALYZE")
        await conn.execute("VACUUM ANALYZE")
        rows = await conn.fetch("SELECT id, created_at FROM sessions ORDER BY created_at, id")
        long_session = str(rows[0]["id"])
        before_last = rows[len(rows) - 101]
        events = shape.long_events
        return {
            "sessions": [str(r["id"]) for r in rows[1 : 1 + ADMISSION_SESSIONS]],
            "long_session": long_session,
            "page_after": {
                "page.start": 0,
                "page.middle": (events // 2 // 100) * 100,
                "page.end": events - 100,
            },
            "list_after": session_cursor(before_last["created_at"], before_last["id"]),
        }
    finally:
        await conn.close()


async def _seed_work(url: str, shape: Shape) -> dict[str, int]:
    """The queue the claim reads and the leases the sweep finds expired."""
    conn = await admin_connect(url)
    try:
        await queue_turns(conn, shape.queued_sessions, shape.queued_per_session)
        await expire_leases(conn, EXPIRED)
        await conn.execute("VACUUM ANALYZE")
        counts = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM sessions) AS sessions, "
            "(SELECT count(*) FROM turns) AS turns, (SELECT count(*) FROM events) AS events, "
            "(SELECT count(*) FROM turns WHERE status = 'QUEUED') AS queued, "
            "(SELECT count(*) FROM turns WHERE status = 'RUNNING') AS running"
        )
        return dict(counts)
    finally:
        await conn.close()


# -- over HTTP ---------------------------------------------------------------


def _graphql(query: str, variables: dict[str, Any]) -> loadgen.Request:
    body = orjson.dumps({"query": query, "variables": variables})
    return ("POST", "/graphql", JSON, body)


def _read_ok(status: int, body: bytes) -> str:
    return "ok" if status == 200 and b'"errors"' not in body else "other"


def _read_request(op: str, place: Place) -> loadgen.Request:
    if op == "sessions.end":
        return _graphql(SESSIONS_QUERY, {"after": place["list_after"]})
    after = place["page_after"][op]
    cursor = keyturn_cursor(after) if after else None
    return _graphql(PAGE_QUERY, {"id": place["long_session"], "after": cursor})


async def _check_read(port: int, op: str, place: Place) -> None:
    """One request first: the page holds its 100 items, or the run stops."""
    conn = loadgen.Connection("127.0.0.1", port)
    try:
        status, body = await conn.request(_read_request(op, place))
    finally:
        conn.close()
    data = orjson.loads(body)
    if status != 200 or "errors" in data:
        raise RuntimeError(f"{op}: {status} {body[:300]!r}")
    page = data["data"]["sessions"] if op == "sessions.end" else data["data"]["session"]["events"]
    if len(page["edges"]) != 100:
        raise RuntimeError(f"{op}: {len(page['edges'])} items, expected 100")


def _client() -> str:
    return "wrk" if shutil.which("wrk") else "python"


def _read_load(cfg: Config, client: str, port: int, req: loadgen.Request, tmp: Path) -> Measured:
    """The same read, over and over, from ``cfg.concurrency`` connections."""
    if client == "wrk":
        path = tmp / "read.tsv"
        method, target, _headers, body = req
        path.write_text(f"{method}\t{target}\t{body.decode()}\n", encoding="utf-8")
        return run_wrk(cfg, port, "cycle.lua", [str(path)], cfg.duration)
    result = asyncio.run(
        loadgen.closed_loop(
            "127.0.0.1",
            port,
            lambda _n: req,
            _read_ok,
            concurrency=cfg.concurrency,
            duration_s=cfg.duration,
        )
    )
    return summarize(result)


def _http_block(url: str, place: Place, prefix: str, cfg: Config, tmp: Path) -> dict[str, Measured]:
    """One server on one database: every HTTP operation once."""
    client = _client()
    env = {"KEYTURN_POOL_SIZE": str(cfg.pool_size), "KEYTURN_LOG_LEVEL": "warning"}
    server = start_server(url, tmp, env=env, name="keyturn", timeout=START_TIMEOUT_S)
    sessions = tmp / "sessions.txt"
    sessions.write_text("\n".join(place["sessions"]) + "\n")
    out: dict[str, Measured] = {}
    try:
        port = port_of(server)
        submit_load(cfg, client, port, "graphql", sessions, f"warm-{prefix}", 0, cfg.warmup)
        drain(url, 60)
        out["admit"] = submit_load(cfg, client, port, "graphql", sessions, prefix, 0, cfg.duration)
        drain(url, 60)
        cycle = replay_cycle(cfg, out["admit"])
        out["replay"] = submit_load(
            cfg, client, port, "graphql", sessions, prefix, cycle, cfg.duration
        )
        for op in ("page.start", "page.middle", "page.end", "sessions.end"):
            asyncio.run(_check_read(port, op, place))
            out[op] = _read_load(cfg, client, port, _read_request(op, place), tmp)
        # Nothing left queued or running for the next block (or the claim) to find.
        drain(url, 60)
    finally:
        server.stop()
    return out


# -- the statements ------------------------------------------------------------


class Timing(TypedDict):
    runs: int
    rows: int  # what the statement returned (the same in every run)
    p50_ms: float
    first_half_p50_ms: float  # against the second half: did the rolled-back runs drift?
    second_half_p50_ms: float


Run = Callable[[Conn], Awaitable[int]]  # one execution; the rows it returned


async def _claim(conn: Conn) -> int:
    return len((await leases.claim(conn, owner=OWNER, ttl_s=10.0, limit=CLAIM_LIMIT)).turns)


async def _sweep(conn: Conn) -> int:
    return len(await leases.interrupt_expired(conn, by=OWNER))


STATEMENT_RUNS: dict[str, Run] = {"claim": _claim, "sweep": _sweep}


def _conn(raw: Any) -> Conn:
    # Keyturn's statements run on a bare asyncpg connection (keyturn.db.sql);
    # there is no pool here (the worker's, WORKER_SETTINGS, sets nothing).
    return Conn(raw)


async def _time_statement(url: str, run: Run, runs: int) -> Timing:
    """``runs`` executions, each in a transaction rolled back; VACUUM first,
    so no series walks the dead index entries the one before left (a
    rolled-back event is the newest of its turn, the first a backward scan of
    ix_events_turn meets)."""
    raw = await admin_connect(url)
    try:
        await raw.execute("VACUUM turns, sessions, events")
        conn = _conn(raw)
        latencies: list[float] = []
        rows = 0
        for i in range(runs + 5):  # 5 to prepare and warm up
            tx = raw.transaction()
            await tx.start()
            try:
                start = time.perf_counter()
                rows = await run(conn)
                elapsed = (time.perf_counter() - start) * 1000
            finally:
                await tx.rollback()
            if i >= 5:
                latencies.append(elapsed)
    finally:
        await raw.close()
    half = len(latencies) // 2
    return {
        "runs": runs,
        "rows": rows,
        "p50_ms": statistics.median(latencies),
        "first_half_p50_ms": statistics.median(latencies[:half]),
        "second_half_p50_ms": statistics.median(latencies[half:]),
    }


# -- EXPLAIN ---------------------------------------------------------------------


async def _statements_of(
    op: str, raw: Any, place: Place
) -> list[tuple[str, Statement, dict[str, Any]]]:
    """The statements behind an operation, with the values it runs them with."""
    sid = uuid.UUID(place["sessions"][0])
    long_sid = uuid.UUID(place["long_session"])
    if op in ("admit", "replay"):
        key = f"explain-{uuid.uuid4().hex[:8]}"
        if op == "replay":
            key = str(
                await raw.fetchval(
                    "SELECT idempotency_key FROM turns WHERE session_id = $1 "
                    "ORDER BY admit_seq DESC LIMIT 1",
                    sid,
                )
            )
        common = {"tenant": "", "session_id": sid, "key": key, "key_retention_s": None}
        admit = {
            **common,
            "turn_id": uuid.uuid4(),
            "fingerprint": "fp",
            "input": "explain",
            "history": "NONE",
            "data": '{"idempotencyKey": "explain", "history": "NONE"}',
        }
        found = [("admission lookup", db_admission._LOOKUP, common)]
        if op == "admit":
            found.append(("admission statement", db_admission._ADMIT_ONE, admit))
        return found
    if op.startswith("page."):
        after = place["page_after"][op]
        params = {"session_id": long_sid, "after": after, "limit": 101}
        return [("events after a cursor", db_reads._EVENTS_AFTER, params)]
    if op == "sessions.end":
        row = await raw.fetchrow(
            "SELECT created_at, id FROM sessions ORDER BY created_at, id "
            "OFFSET (SELECT count(*) - 101 FROM sessions) LIMIT 1"
        )
        page = {"tenant": "", "after_ts": row["created_at"], "after_id": row["id"], "limit": 101}
        return [
            ("sessions after a cursor", db_reads._SESSIONS_AFTER, page),
            ("the count of sessions (totalCount)", db_reads._SESSION_COUNT, {"tenant": ""}),
        ]
    if op == "claim":
        params = {"owner": OWNER, "ttl": 10.0, "limit": CLAIM_LIMIT}
        return [("the claim", leases._CLAIM, params)]
    return [("the sweep", leases._INTERRUPT_EXPIRED, {"by": OWNER})]


async def explain_pooled(
    db: Any,
    stmt: Statement,
    params: dict[str, Any],
    options: str,
    settings: dict[str, str] = REQUEST_SETTINGS,
) -> str:
    """EXPLAIN (``options``) of the plan a pool with these ``settings`` runs
    (the requests' pool by default: its generic plan, made without the
    values; with none, PostgreSQL's own choice for a statement's first
    calls, a plan made for the values). The statement is prepared, then
    executed with these values (:func:`execute_arguments`)."""
    name = f"plan_{uuid.uuid4().hex}"
    await db.execute(f"PREPARE {name} AS {stmt.sql}")
    values = await execute_arguments(db, name, [params[n] for n in stmt.names])
    await db.execute("RESET plan_cache_mode")
    for setting, value in settings.items():
        await db.execute(f"SET {setting} = {value}")
    rows = await db.fetch(f"EXPLAIN ({options}) EXECUTE {name}({values})")
    await db.execute(f"DEALLOCATE {name}")
    return "\n".join(row[0] for row in rows)


async def execute_arguments(db: Any, name: str, args: list[Any]) -> str:
    """The argument list of ``EXECUTE name(...)`` for these values: EXECUTE
    takes no bound parameters, so each goes in as a literal of the type
    PostgreSQL inferred for the prepared statement's parameter (one round
    trip for all of them)."""
    if not args:
        return ""
    types = await db.fetchval(
        "SELECT CAST(parameter_types AS text[]) FROM pg_prepared_statements WHERE name = $1", name
    )
    literals = ", ".join(
        f"quote_nullable(CAST(CAST(${i} AS {t}) AS text)) || '::{t}'"
        for i, t in enumerate(types, start=1)
    )
    return ", ".join(await db.fetchrow(f"SELECT {literals}", *args))


async def explain(url: str, op: str, place: Place) -> list[dict[str, str]]:
    """EXPLAIN (ANALYZE, BUFFERS) of each statement behind ``op``, in a
    transaction rolled back."""
    raw = await admin_connect(url)
    out: list[dict[str, str]] = []
    try:
        for name, stmt, params in await _statements_of(op, raw, place):
            missing = next((n for n in stmt.names if n not in params), None)
            if missing is not None:
                out.append({"statement": name, "plan": f"(not explained: no value for {missing})"})
                continue
            tx = raw.transaction()
            await tx.start()
            try:
                # The claim and the sweep run on the worker's pool.
                settings = WORKER_SETTINGS if op in STATEMENT_RUNS else REQUEST_SETTINGS
                plan = await explain_pooled(raw, stmt, params, "ANALYZE, BUFFERS", settings)
            finally:
                await tx.rollback()
            out.append({"statement": name, "plan": plan})
    finally:
        await raw.close()
    return out


# -- the run ---------------------------------------------------------------------


def measure(args: argparse.Namespace) -> dict[str, Any]:
    record = record_shape(args)
    # The sizes the HTTP loads run with, as ``make bench`` takes them.
    flags = {"--concurrency": args.concurrency, "--duration": args.duration}
    flags["--pool-size"] = args.pool_size
    cfg = parse_args([str(x) for pair in flags.items() for x in pair])
    started = time.perf_counter()
    with (
        database_server(args.database) as (admin_url, where),
        target_databases(admin_url, ("empty", "record")) as urls,
        tempfile.TemporaryDirectory(prefix="keyturn-bench-scale-") as tmp,
    ):
        progress(f"database: {where}")
        progress(
            f"seeding the record with bulk SQL: {record.sessions:,} sessions, "
            f"{record.turns:,} turns, {record.turns * EVENTS_PER_TURN:,} events "
            f"(one session of {record.long_events:,})"
        )
        places = {
            "empty": asyncio.run(_seed(urls["empty"], EMPTY, "empty")),
            "record": asyncio.run(_seed(urls["record"], record, "record")),
        }
        seeded_s = time.perf_counter() - started

        http: dict[str, dict[str, list[Measured]]] = {"empty": {}, "record": {}}
        order = [("empty", "record"), ("record", "empty")]
        for r in range(args.rounds):
            for db in order[r % 2]:
                progress(f"round {r + 1}: keyturn serve on the {db} database")
                block = _http_block(urls[db], places[db], f"r{r}", cfg, Path(tmp))
                for op, m in block.items():
                    http[db].setdefault(op, []).append(m)
                    progress(
                        f"  {op:<13} {m['throughput']:8.0f}/s  p50 {m['p50_ms']:6.1f} ms  "
                        f"p99 {m['p99_ms']:6.1f} ms  {dict(m['answers'])}"
                    )

        progress(
            f"queueing {record.queued:,} turns across {record.queued_sessions:,} sessions "
            f"and {EXPIRED} expired leases (empty database: {EMPTY.queued} and {EXPIRED})"
        )
        counts = {
            "empty": asyncio.run(_seed_work(urls["empty"], EMPTY)),
            "record": asyncio.run(_seed_work(urls["record"], record)),
        }
        timings: dict[str, dict[str, list[Timing]]] = {"empty": {}, "record": {}}
        for r in range(3):
            for db in order[r % 2]:
                for op, run in STATEMENT_RUNS.items():
                    t = asyncio.run(_time_statement(urls[db], run, args.statement_runs))
                    timings[db].setdefault(op, []).append(t)
                    progress(
                        f"  {db:<6} {op:<5} p50 {t['p50_ms']:7.2f} ms ({t['rows']} rows; halves "
                        f"{t['first_half_p50_ms']:.2f} / {t['second_half_p50_ms']:.2f} ms)"
                    )

        results: dict[str, dict[str, Any]] = {}
        for op, label in OPS:
            if op == "claim":
                label = (
                    f"the claim, {record.queued:,} turns queued across "
                    f"{record.queued_sessions:,} sessions"
                )
            if op in STATEMENT_RUNS:
                empty_t = min(timings["empty"][op], key=lambda t: t["p50_ms"])
                record_t = min(timings["record"][op], key=lambda t: t["p50_ms"])
                ratio = empty_t["p50_ms"] / record_t["p50_ms"]
                detail: dict[str, Any] = {
                    "empty": empty_t,
                    "record": record_t,
                    "empty_per_s": 1000 / empty_t["p50_ms"],
                    "record_per_s": 1000 / record_t["p50_ms"],
                }
            else:
                empty_m = max(http["empty"][op], key=lambda m: m["throughput"])
                record_m = max(http["record"][op], key=lambda m: m["throughput"])
                ratio = record_m["throughput"] / empty_m["throughput"]
                detail = {
                    "empty": empty_m,
                    "record": record_m,
                    "empty_per_s": empty_m["throughput"],
                    "record_per_s": record_m["throughput"],
                    "rounds": {db: [m["throughput"] for m in http[db][op]] for db in http},
                }
            verdict = judge(ratio_target(op, label), ratio)
            results[op] = {"label": label, "ratio": ratio, "verdict": verdict, **detail}
            if args.explain_all or not verdict["met"]:
                progress(f"EXPLAIN (ANALYZE) of {op} on the record")
                results[op]["plans"] = asyncio.run(explain(urls["record"], op, places["record"]))
    return {
        "row": "scale",
        "label": "operations on a record of 1,000,000 events (ratio to an empty database)",
        "database": where,
        "record": {
            "sessions": record.sessions,
            "turns_per_session": record.turns_per_session,
            "long_session_events": record.long_events,
            "queued": record.queued,
            "queued_sessions": record.queued_sessions,
            "expired_leases": EXPIRED,
            "counted": counts["record"],
        },
        "empty": {"counted": counts["empty"], "long_session_events": EMPTY.long_events},
        "client": _client(),
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "statement_runs": args.statement_runs,
        "seeding_s": seeded_s,
        "elapsed_s": time.perf_counter() - started,
        "target": RATIO_FLOOR,
        "ops": results,
    }


def report(row: dict[str, Any]) -> None:
    rec = row["record"]["counted"]
    print()
    print(
        f"scale: {rec['sessions']:,} sessions, {rec['turns']:,} turns ({rec['queued']:,} queued, "
        f"{rec['running']} with expired leases), {rec['events']:,} events; "
        f"one session of {row['record']['long_session_events']:,} events"
    )
    print(f"{'op':<13} {'empty /s':>10} {'record /s':>10}  what")
    for op, res in row["ops"].items():
        print(f"{op:<13} {res['empty_per_s']:10.0f} {res['record_per_s']:10.0f}  {res['label']}")
    print()
    print("targets (record / empty, measured, must reach)")
    verdicts: list[Verdict] = [res["verdict"] for res in row["ops"].values()]
    for v in verdicts:
        print(line(v))
    for op, res in row["ops"].items():
        for plan in res.get("plans", []):
            print()
            print(f"{op}: {plan['statement']}, on the record")
            print(plan["plan"])
    print()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=10_000, help="sessions in the record")
    p.add_argument("--turns", type=int, default=200_000, help="turns in the record, at least")
    p.add_argument("--long-events", type=int, default=100_000, help="events of the long session")
    p.add_argument("--queued", type=int, default=10_000, help="turns queued for the claim")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per HTTP operation")
    p.add_argument("--rounds", type=int, default=3, help="HTTP rounds per database")
    p.add_argument("--concurrency", type=int, default=16, help="connections of the load")
    p.add_argument("--pool-size", type=int, default=10, help="KEYTURN_POOL_SIZE")
    p.add_argument("--statement-runs", type=int, default=100, help="runs per statement series")
    p.add_argument("--explain-all", action="store_true", help="EXPLAIN every operation")
    p.add_argument("--database", default="auto", help="auto, embedded, or a URL")
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    row = measure(args)
    report(row)
    if args.out is not None:
        args.out.write_text(json.dumps(row, indent=2, default=str) + "\n")
        print(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
