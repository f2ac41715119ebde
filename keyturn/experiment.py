"""``keyturn experiment interruption``: what the record can establish when a
server dies in the middle of a tool call.

On a throwaway database, real ``keyturn serve`` processes run turns that make
two synthetic writes each, one set with the IDEMPOTENT ``synthetic_write``
(``/write``) and one with the UNSAFE ``synthetic_append`` (``/append``). For
each crash point the server stops itself with SIGKILL at that point of the
second call (a test hook, ``KEYTURN_CRASH_AT``: every turn waits at the point
until the last one reaches it, so all runs of a point are cut at the same
place, by one kill). A replacement process interrupts the turns once their
leases run out and reconciles what it can. Then the record (``Turn.toolCalls``
over GraphQL) is set beside the external store (its table, read directly),
call by call:

agreed        the record says the effect happened (COMPLETED, RECONCILED_APPLIED)
              and the store has it once, or says it did not (NOT_STARTED,
              RECONCILED_NOT_APPLIED) and the store has nothing
uncertain     the record says OUTCOME_UNKNOWN: it claims nothing
contradicted  anything else
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from keyturn.runtime.crash import POINTS
from keyturn.serverproc import ServerProcess, start_server

KINDS = (("IDEMPOTENT", "/write"), ("UNSAFE", "/append"))
HAPPENED = {"COMPLETED", "RECONCILED_APPLIED"}
DID_NOT = {"NOT_STARTED", "RECONCILED_NOT_APPLIED"}
CRASHED_CALL = 1  # the second (and last) call of each turn

_TURN = """query($id: ID!) { turn(id: $id) { id status
  toolCalls { index tool kind state effectKey } } }"""
_SUBMIT = """mutation($i: SubmitTurnInput!) { submitTurn(input: $i) {
  __typename ... on TurnAdmission { turn { id } } } }"""


def verdict(state: str | None, applied: int) -> str:
    if state == "OUTCOME_UNKNOWN":
        return "uncertain" if applied <= 1 else "contradicted"
    if state in HAPPENED:
        return "agreed" if applied == 1 else "contradicted"
    # NOT_STARTED, RECONCILED_NOT_APPLIED, or no record of the call at all
    return "agreed" if applied == 0 else "contradicted"


@dataclass
class Row:
    point: str
    kind: str
    runs: int = 0
    record: Counter[str] = field(default_factory=Counter)
    store: Counter[str] = field(default_factory=Counter)
    verdicts: Counter[str] = field(default_factory=Counter)


class Progress:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.monotonic()

    def __call__(self, text: str) -> None:
        line = f"[{time.monotonic() - self.started:5.1f}s] {text}"
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# -- processes and HTTP -------------------------------------------------------
def _start_server(
    database_url: str, workdir: Path, runs: int, crash_at: str | None
) -> ServerProcess:
    env = {
        "KEYTURN_LEASE_TTL_S": "2",
        "KEYTURN_LEASE_RENEW_S": "0.4",
        "KEYTURN_CLAIM_POLL_S": "0.2",
        "KEYTURN_MAX_RUNNING_TURNS": str(2 * runs * len(KINDS) + 8),
        "KEYTURN_POOL_SIZE": "20",
        "KEYTURN_LOG_LEVEL": "warning",
    }
    if crash_at is not None:
        env["KEYTURN_CRASH_AT"] = f"{crash_at}:{CRASHED_CALL}"
        env["KEYTURN_CRASH_AFTER"] = str(runs * len(KINDS))
    return start_server(database_url, workdir, env=env)


def _gql(server: ServerProcess, query: str, variables: dict[str, Any]) -> Any:
    body = json.dumps({"query": query, "variables": variables}).encode()
    req = urllib.request.Request(
        server.url + "/graphql", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        answer = json.loads(r.read())
    if answer.get("errors"):
        raise RuntimeError(f"GraphQL errors: {answer['errors']}")
    return answer["data"]


# -- the database -------------------------------------------------------------
@contextlib.contextmanager
def throwaway_database(base_url: str | None) -> Iterator[str]:
    """A fresh database on ``base_url``'s server, or on an embedded PostgreSQL
    in a temporary directory; dropped afterwards."""
    from keyturn.db.engine import asyncpg_dsn

    handle: Any = None
    data_dir: Path | None = None
    if base_url is None:
        from keyturn.db import embedded

        data_dir = Path(tempfile.mkdtemp(prefix="keyturn-experiment-"))
        base_url, handle = embedded.start(data_dir)
    from sqlalchemy.engine import make_url

    name = f"keyturn_experiment_{uuid.uuid4().hex[:12]}"

    async def admin(statement: str) -> None:
        import asyncpg

        conn = await asyncpg.connect(asyncpg_dsn(base_url))
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if handle is not None:
            handle.cleanup()
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)


def _store_counts(database_url: str, keys: list[str]) -> dict[str, int]:
    from keyturn.db import store
    from keyturn.db.engine import connect, create_engine

    async def read() -> dict[str, int]:
        engine = create_engine(database_url, pool_size=1)
        try:
            async with connect(engine) as conn:
                return await store.applied_counts(conn, keys=keys)
        finally:
            await engine.dispose()

    return asyncio.run(read())


# -- the experiment -----------------------------------------------------------
def _submit_all(server: ServerProcess, point: str, runs: int) -> list[tuple[str, str, int]]:
    turns = []
    for kind, directive in KINDS:
        for run in range(runs):
            sid = _gql(server, "mutation { createSession { id } }", {})["createSession"]["id"]
            text = f"{directive} a={point}-{run} {directive} b={point}-{run}"
            answer = _gql(
                server,
                _SUBMIT,
                {"i": {"sessionId": sid, "idempotencyKey": f"{point}-{run}", "input": text}},
            )
            turns.append((answer["submitTurn"]["turn"]["id"], kind, run))
    return turns


def _settled(turn: dict[str, Any], crashed: bool) -> bool:
    if not crashed:
        return bool(turn["status"] in ("COMPLETED", "FAILED"))
    unknown = [
        c
        for c in turn["toolCalls"]
        if c["state"] == "OUTCOME_UNKNOWN" and c["kind"] == "IDEMPOTENT"
    ]
    return bool(turn["status"] == "INTERRUPTED" and not unknown)


def _observe(
    server: ServerProcess,
    database_url: str,
    point: str,
    turns: list[tuple[str, str, int]],
    crashed: bool,
    progress: Progress,
    label: str,
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 120
    pending = {t[0] for t in turns}
    seen: dict[str, dict[str, Any]] = {}
    while pending:
        for turn_id in sorted(pending):
            turn = _gql(server, _TURN, {"id": turn_id})["turn"]
            if _settled(turn, crashed):
                seen[turn_id] = turn
                pending.discard(turn_id)
        progress(f"{label}: {len(turns) - len(pending)}/{len(turns)} turns settled")
        if pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"turns not settled in time: {sorted(pending)}")
            time.sleep(0.25)
    keys = [f"{turn_id}/{i}" for turn_id, _k, _r in turns for i in range(2)]
    counts = _store_counts(database_url, keys)
    observations = []
    for turn_id, kind, run in turns:
        by_index = {c["index"]: c for c in seen[turn_id]["toolCalls"]}
        calls = []
        for index in range(2):
            state = by_index[index]["state"] if index in by_index else None
            key = by_index[index]["effectKey"] if index in by_index else f"{turn_id}/{index}"
            applied = counts.get(key, 0)
            calls.append(
                {
                    "index": index,
                    "effectKey": key,
                    "record": state or "NOT_STARTED",
                    "storeApplied": applied,
                    "verdict": verdict(state, applied),
                }
            )
        observations.append(
            {
                "point": point,
                "kind": kind,
                "run": run,
                "turnId": turn_id,
                "status": seen[turn_id]["status"],
                "calls": calls,
            }
        )
    return observations


def run_interruption(
    *, runs: int, database_url: str | None, progress_stream: TextIO
) -> dict[str, Any]:
    progress = Progress(progress_stream)
    observations: list[dict[str, Any]] = []
    workdir = Path(tempfile.mkdtemp(prefix="keyturn-experiment-logs-"))
    started = time.monotonic()
    try:
        with throwaway_database(database_url) as url:
            progress("starting a server")
            server = _start_server(url, workdir, runs, POINTS[0])
            for n, point in enumerate(POINTS):
                label = f"crash point {n + 1}/{len(POINTS)} {point}"
                progress(f"{label}: running {runs * len(KINDS)} turns")
                turns = _submit_all(server, point, runs)
                try:
                    server.proc.wait(60)
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"the server did not stop at {point}") from None
                if server.proc.returncode != -signal.SIGKILL:
                    raise RuntimeError(
                        f"the server exited with {server.proc.returncode}, not SIGKILL:\n"
                        + server.log()
                    )
                progress(f"{label}: killed; starting a replacement")
                following = POINTS[n + 1] if n + 1 < len(POINTS) else None
                server = _start_server(url, workdir, runs, following)
                observations += _observe(server, url, point, turns, True, progress, label)
            label = "no crash (control)"
            progress(f"{label}: running {runs * len(KINDS)} turns")
            turns = _submit_all(server, "none", runs)
            observations += _observe(server, url, "none", turns, False, progress, label)
            server.stop()
    finally:
        progress.done()
        shutil.rmtree(workdir, ignore_errors=True)
    return summarize(observations, runs=runs, seconds=time.monotonic() - started)


def summarize(observations: list[dict[str, Any]], *, runs: int, seconds: float) -> dict[str, Any]:
    rows: dict[tuple[str, str], Row] = {}
    earlier = Counter[str]()
    for o in observations:
        row = rows.setdefault((o["point"], o["kind"]), Row(o["point"], o["kind"]))
        row.runs += 1
        crashed = o["calls"][CRASHED_CALL]
        row.record[crashed["record"]] += 1
        n = crashed["storeApplied"]
        row.store["not applied" if n == 0 else "applied once" if n == 1 else f"applied {n}x"] += 1
        row.verdicts[crashed["verdict"]] += 1
        for call in o["calls"][:CRASHED_CALL]:
            earlier[call["verdict"]] += 1
    total = Counter[str]()
    for row in rows.values():
        total.update(row.verdicts)
    total.update(earlier)
    return {
        "runsPerPoint": runs,
        "seconds": round(seconds, 1),
        "rows": [
            {
                "point": r.point,
                "kind": r.kind,
                "runs": r.runs,
                "record": dict(r.record),
                "store": dict(r.store),
                "agreed": r.verdicts["agreed"],
                "uncertain": r.verdicts["uncertain"],
                "contradicted": r.verdicts["contradicted"],
            }
            for r in rows.values()
        ],
        "earlierCalls": dict(earlier),
        "contradictions": total["contradicted"],
        "observations": observations,
    }


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items()))


def table(summary: dict[str, Any]) -> str:
    header = ("crash point", "tool", "runs", "record says", "store says", "agreed", "uncertain",
              "contradicted")  # fmt: skip
    lines = [
        (
            r["point"],
            r["kind"],
            str(r["runs"]),
            _counts(r["record"]),
            _counts(r["store"]),
            str(r["agreed"]),
            str(r["uncertain"]),
            str(r["contradicted"]),
        )
        for r in summary["rows"]
    ]
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [fmt(header), fmt(tuple("-" * w for w in widths))]
    out += [fmt(x) for x in lines]
    earlier = summary["earlierCalls"]
    out.append("")
    out.append(
        f"The call before the crash point, in every turn: {_counts(earlier)}. "
        f"Contradictions in all: {summary['contradictions']}. "
        f"({summary['runsPerPoint']} runs per point, {summary['seconds']} s)"
    )
    return "\n".join(out)
