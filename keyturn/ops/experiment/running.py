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
call by call, and judged (:mod:`keyturn.ops.experiment.judging`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from keyturn.domain import ToolCallState, ToolKind, TurnStatus
from keyturn.ops.databases import throwaway_database
from keyturn.ops.experiment.judging import CRASHED_CALL, summarize, verdict
from keyturn.ops.experiment.rendering import Progress
from keyturn.ops.serverproc import ServerProcess, start_server
from keyturn.runtime.crash import POINTS

KINDS = ((ToolKind.IDEMPOTENT, "/write"), (ToolKind.UNSAFE, "/append"))

_TURN = """query($id: ID!) { turn(id: $id) { id status
  toolCalls { index tool kind state effectKey } } }"""
_SUBMIT = """mutation($i: SubmitTurnInput!) { submitTurn(input: $i) {
  __typename ... on TurnAdmission { turn { id } } } }"""


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
def _store_counts(database_url: str, keys: list[str]) -> dict[str, int]:
    from keyturn.db import synthetic_store
    from keyturn.db.engine import connect, create_engine

    async def read() -> dict[str, int]:
        engine = create_engine(database_url, pool_size=1)
        try:
            async with connect(engine) as conn:
                return await synthetic_store.applied_counts(conn, keys=keys)
        finally:
            await engine.dispose()

    return asyncio.run(read())


# -- the experiment -----------------------------------------------------------
def _submit_all(server: ServerProcess, point: str, runs: int) -> list[tuple[str, str, int]]:
    turns: list[tuple[str, str, int]] = []
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
        return bool(turn["status"] in (TurnStatus.COMPLETED, TurnStatus.FAILED))
    unknown = [
        c
        for c in turn["toolCalls"]
        if c["state"] == ToolCallState.OUTCOME_UNKNOWN and c["kind"] == ToolKind.IDEMPOTENT
    ]
    return bool(turn["status"] == TurnStatus.INTERRUPTED and not unknown)


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
        with throwaway_database(database_url, prefix="keyturn_experiment") as url:
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
