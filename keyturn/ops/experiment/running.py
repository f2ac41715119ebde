"""``keyturn experiment interruption``: what the record can establish when a
server dies in the middle of a tool call.

On a throwaway database, real ``keyturn serve`` processes run turns that make
two calls each of one tool. The tools are of every kind: the builtin
synthetic ones, the IDEMPOTENT ``synthetic_write`` (``/write``) and the UNSAFE
``synthetic_append`` (``/append``), which write a table of the database; and
one of each kind from a real MCP server over stdio
(:mod:`keyturn.ops.experiment.mcp_store`, ``/call store__TOOL {...}``), which
writes a SQLite file. For each crash point the server stops itself with
SIGKILL at that point of the second call (a test hook, ``KEYTURN_CRASH_AT``:
every turn waits at the point until the last one reaches it, so all runs of a
point are cut at the same place, by one kill). A replacement process
interrupts the turns once their leases run out and reconciles what it can.
Then the record (``Turn.toolCalls`` over GraphQL) is set beside the stores
(read directly), call by call, and judged (:mod:`keyturn.ops.experiment.judging`).

The ``cancelled mid-tool`` row cancels instead of killing: turns of three
calls, each held after the intent of its second call (the other test hook,
``KEYTURN_HOLD_AT``), get a ``cancelTurn``; once the record shows
``turn.cancel_requested``, the held calls are released (a file appears). The
call in flight must finish with its result, the one after it must not start,
and the turn must end CANCELLED with the output so far.

The ``retry racing reconciliation`` rows race a RETRY against the
replacement's question about an IDEMPOTENT call it cut (the tools of that
kind only). The after-write variant's turns are cut with the ``after_write``
point's; the after-intent variant's, of four calls, at the end, after the
intent of their last call (an index no other turn reaches, so the
replacement's own crash point is never met by a retry). Each replacement
holds every answer about the cut call once the store has given it and before
``tool.reconciled`` records it (the hook's ``before_reconciled`` point, a
retry's own question included); meanwhile each turn, INTERRUPTED with its
call still OUTCOME_UNKNOWN and the store already answered, gets a
``resolveInterruptedTurn`` RETRY; once the retries run, the answers are
released. Both turns are then judged beside the store (``race_findings``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from keyturn.domain import TERMINAL_STATUSES, EventType, ToolCallState, ToolKind, TurnStatus
from keyturn.ops.databases import throwaway_database
from keyturn.ops.experiment import sqlite_store
from keyturn.ops.experiment.judging import (
    CRASHED_CALL,
    cancel_findings,
    cancel_verdict,
    race_findings,
    race_verdict,
    ran_before_settled,
    read_verdict,
    set_verdict,
    summarize,
    verdict,
)
from keyturn.ops.experiment.rendering import Progress
from keyturn.ops.serverproc import ServerProcess, start_server
from keyturn.runtime.crash import POINTS

CALLS_PER_TURN = 2
CANCELLED = "cancelled mid-tool"  # the row's point
CANCELLED_CALLS = 3  # one before the call in flight, and one after it
HELD_AT = f"after_intent:{CRASHED_CALL}"
SEEDED = "seeded"  # what the store holds under every name a read asks for
RACE = "retry racing reconciliation"
# The after-intent variant's cut call: past every call the cancelled and
# control turns make, so the server that runs them can cut these.
RACE_CUT = CANCELLED_CALLS


@dataclass(frozen=True, slots=True)
class Subject:
    """A tool the experiment calls, and how the fixture model is asked to."""

    tool: str
    kind: ToolKind

    def directive(self, name: str, value: str) -> str:
        if self.tool == "synthetic_write":
            return f"/write {name}={value}"
        if self.tool == "synthetic_append":
            return f"/append {name}={value}"
        arguments = (
            {"name": name} if self.kind is ToolKind.READ_ONLY else {"name": name, "value": value}
        )
        return f"/call {self.tool} {json.dumps(arguments)}"


def _mcp(tool: str, kind: ToolKind) -> Subject:
    return Subject(f"{sqlite_store.SERVER}__{tool}", kind)


SUBJECTS = (
    Subject("synthetic_write", ToolKind.IDEMPOTENT),
    Subject("synthetic_append", ToolKind.UNSAFE),
    _mcp("read", ToolKind.READ_ONLY),
    _mcp("set", ToolKind.REPEATABLE),
    _mcp("write", ToolKind.IDEMPOTENT),
    _mcp("append", ToolKind.UNSAFE),
)
RACE_SUBJECTS = tuple(s for s in SUBJECTS if s.kind is ToolKind.IDEMPOTENT)

_TURN = """query($id: ID!) { turn(id: $id) { id status
  toolCalls { index tool kind state effectKey result } } }"""
_SUBMIT = """mutation($i: SubmitTurnInput!) { submitTurn(input: $i) {
  __typename ... on TurnAdmission { turn { id } } } }"""
_CANCELLED_TURN = """query($id: ID!) { turn(id: $id) { id status output
  events { type data } toolCalls { index tool kind state effectKey result } } }"""
_CANCEL = """mutation($i: CancelTurnInput!) { cancelTurn(input: $i) {
  __typename ... on TurnCancellation { replayed turn { status cancelRequested } } } }"""
_RACE_TURN = """query($id: ID!) { turn(id: $id) { id status
  events { seq type data } toolCalls { index tool kind state effectKey result } } }"""
_RETRY = """mutation($i: ResolveInterruptedTurnInput!) { resolveInterruptedTurn(input: $i) {
  __typename ... on TurnResolved { retry { id } } } }"""


@dataclass(frozen=True, slots=True)
class Submitted:
    turn_id: str
    subject: Subject
    run: int
    names: tuple[str, ...]  # each call's NAME, by index
    value: str


# -- processes and HTTP -------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hooks:
    """A server's test hooks: where it kills itself, after how many calls,
    and where it holds calls until a file appears."""

    crash_at: str | None = None  # POINT:INDEX
    crash_after: int = 1
    hold_at: str | None = None  # POINT:INDEX
    release: Path | None = None


def _start_server(
    database_url: str, workdir: Path, tools_file: Path, runs: int, hooks: Hooks
) -> ServerProcess:
    turns = runs * (len(SUBJECTS) + len(RACE_SUBJECTS))
    env = {
        "KEYTURN_LEASE_TTL_S": "2",
        "KEYTURN_LEASE_RENEW_S": "0.4",
        "KEYTURN_CLAIM_POLL_S": "0.2",
        "KEYTURN_MAX_RUNNING_TURNS": str(2 * turns + 8),
        "KEYTURN_POOL_SIZE": "20",
        # Sized for the turns' writes, not one connection per running turn
        # (the default): every turn is running at once, held at the point.
        "KEYTURN_WORK_POOL_SIZE": "24",
        "KEYTURN_LOG_LEVEL": "warning",
        "KEYTURN_TOOLS_FILE": str(tools_file),
    }
    if hooks.crash_at is not None:
        env["KEYTURN_CRASH_AT"] = hooks.crash_at
        env["KEYTURN_CRASH_AFTER"] = str(hooks.crash_after)
    if hooks.hold_at is not None and hooks.release is not None:
        env["KEYTURN_HOLD_AT"] = hooks.hold_at
        env["KEYTURN_HOLD_UNTIL"] = str(hooks.release)
    return start_server(database_url, workdir, env=env)


def _gql(server: ServerProcess, query: str, variables: dict[str, Any]) -> Any:
    body = json.dumps({"query": query, "variables": variables}).encode()
    req = urllib.request.Request(
        server.url + "/graphql", data=body, headers={"content-type": "application/json"}
    )
    # 503 is retryable (the database did not answer in time, on a shared
    # server under load); retrying is safe: reads, and submitTurn under its key.
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                answer = json.loads(r.read())
            break
        except urllib.error.HTTPError as error:
            text = error.read()[:500]
            if error.code != 503 or time.monotonic() > deadline:
                raise RuntimeError(f"HTTP {error.code} from the server: {text!r}") from None
            time.sleep(float(error.headers.get("retry-after") or 1))
    if answer.get("errors"):
        raise RuntimeError(f"GraphQL errors: {answer['errors']}")
    return answer["data"]


# -- the stores -----------------------------------------------------------------
def _synthetic_counts(database_url: str, keys: list[str]) -> dict[str, int]:
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


def _synthetic_answered(database_url: str, keys: list[str]) -> set[str]:
    from keyturn.db import synthetic_store
    from keyturn.db.engine import connect, create_engine

    async def read() -> set[str]:
        engine = create_engine(database_url, pool_size=1)
        try:
            async with connect(engine) as conn:
                return await synthetic_store.answered(conn, keys=keys)
        finally:
            await engine.dispose()

    return asyncio.run(read())


def _applied_label(n: int) -> str:
    return "not applied" if n == 0 else "applied once" if n == 1 else f"applied {n}x"


class _Judge:
    """Each call's record beside its store, read once all turns have settled."""

    def __init__(
        self, database_url: str, store: sqlite_store.Store, turns: list[Submitted]
    ) -> None:
        keys = [f"{t.turn_id}/{i}" for t in turns for i in range(len(t.names))]
        names = [name for t in turns for name in t.names]
        self.synthetic = _synthetic_counts(database_url, keys)
        self.keyed = store.applied_counts(keys)
        self.appended = store.append_counts(names)
        self.values = store.values(names)

    def call(self, subject: Subject, state: str | None, call: dict[str, Any] | None, *,
             key: str, name: str, value: str) -> tuple[str, str]:  # fmt: skip
        """What the store says of the call, and the verdict."""
        if subject.kind is ToolKind.READ_ONLY:
            held = self.values[name]
            read = _read_value(call)
            label = "unchanged" if held == SEEDED else f"changed to {held!r}"
            return label, read_verdict(state, read=read, before=SEEDED, after=held)
        if subject.kind is ToolKind.REPEATABLE:
            held = self.values[name]
            label = "not set" if held is None else "set" if held == value else f"set to {held!r}"
            return label, set_verdict(state, held, value)
        if subject.tool.startswith("synthetic_"):
            n = self.synthetic.get(key, 0)
        elif subject.kind is ToolKind.IDEMPOTENT:
            n = self.keyed.get(key, 0)
        else:
            n = self.appended[name]
        return _applied_label(n), verdict(state, n)


def _read_value(call: dict[str, Any] | None) -> str | None:
    result = (call or {}).get("result") or {}
    structured = result.get("structuredContent") if isinstance(result, dict) else None
    value = structured.get("value") if isinstance(structured, dict) else None
    return value if isinstance(value, str) else None


# -- the experiment -----------------------------------------------------------
def _submit_all(
    server: ServerProcess,
    store: sqlite_store.Store,
    point: str,
    runs: int,
    calls: int = CALLS_PER_TURN,
    subjects: tuple[Subject, ...] = SUBJECTS,
    tag: str | None = None,
) -> list[Submitted]:
    turns: list[Submitted] = []
    point = tag or point.split()[0]  # one word: names and values are read up to a space
    for subject in subjects:
        for run in range(runs):
            names = tuple(f"{subject.tool}-{point}-{run}-{i}" for i in range(calls))
            value = f"{point}-{run}"
            if subject.kind is ToolKind.READ_ONLY:
                for name in names:
                    store.set(name, SEEDED)
            sid = _gql(server, "mutation { createSession { id } }", {})["createSession"]["id"]
            text = " ".join(subject.directive(name, value) for name in names)
            answer = _gql(
                server,
                _SUBMIT,
                {"i": {"sessionId": sid, "idempotencyKey": f"{point}-{run}", "input": text}},
            )
            turn_id = answer["submitTurn"]["turn"]["id"]
            turns.append(Submitted(turn_id, subject, run, names, value))
    return turns


def _settled(turn: dict[str, Any], crashed: bool, cancelled: bool = False) -> bool:
    unknown = [
        c
        for c in turn["toolCalls"]
        if c["state"] == ToolCallState.OUTCOME_UNKNOWN and c["kind"] == ToolKind.IDEMPOTENT
    ]
    if cancelled:
        # CANCELLED, or ended otherwise (a finding): interrupted, once reconciled.
        return turn["status"] in TERMINAL_STATUSES and not (
            turn["status"] == TurnStatus.INTERRUPTED and unknown
        )
    if not crashed:
        return bool(turn["status"] in (TurnStatus.COMPLETED, TurnStatus.FAILED))
    return bool(turn["status"] == TurnStatus.INTERRUPTED and not unknown)


def _cancel_held(
    server: ServerProcess, turns: list[Submitted], progress: Progress, label: str
) -> None:
    """Once every turn's second call is held after its intent, cancel each
    turn (its own key) and see the record say so; the caller then releases
    the held calls."""
    deadline = time.monotonic() + 60
    pending = {t.turn_id for t in turns}
    while pending:
        for turn_id in sorted(pending):
            turn = _gql(server, _TURN, {"id": turn_id})["turn"]
            calls = {c["index"]: c["state"] for c in turn["toolCalls"]}
            if turn["status"] == TurnStatus.RUNNING and (
                calls.get(CRASHED_CALL) == ToolCallState.OUTCOME_UNKNOWN
            ):
                pending.discard(turn_id)  # its intent is recorded, its result is not
        progress(f"{label}: {len(turns) - len(pending)}/{len(turns)} turns held in a call")
        if pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"turns not held in time: {sorted(pending)}")
            time.sleep(0.25)
    for t in turns:
        answer = _gql(
            server,
            _CANCEL,
            {"i": {"turnId": t.turn_id, "idempotencyKey": f"cancel-{t.run}", "reason": label}},
        )["cancelTurn"]
        running = answer.get("turn") or {}
        if answer["__typename"] != "TurnCancellation" or not running.get("cancelRequested"):
            raise RuntimeError(f"turn {t.turn_id}: cancelTurn answered {answer}")
        events = _gql(server, _CANCELLED_TURN, {"id": t.turn_id})["turn"]["events"]
        if EventType.TURN_CANCEL_REQUESTED not in [e["type"] for e in events]:
            raise RuntimeError(f"turn {t.turn_id}: no turn.cancel_requested after cancelTurn")
    progress(f"{label}: {len(turns)}/{len(turns)} cancels recorded")


def _judged_calls(
    t: Submitted, tool_calls: list[dict[str, Any]], judge: _Judge
) -> list[dict[str, Any]]:
    """Each call the turn was to make, as the record and the store tell it
    (a call the record never planned is NOT_STARTED), with the verdict."""
    by_index = {c["index"]: c for c in tool_calls}
    calls: list[dict[str, Any]] = []
    for index in range(len(t.names)):
        call = by_index.get(index)
        if call is not None and call["kind"] != t.subject.kind:
            # The tools file or the server is not what the experiment
            # expects: not a finding, a broken run.
            raise RuntimeError(
                f"{t.subject.tool} is offered as {call['kind']}, not {t.subject.kind.value}"
            )
        state = call["state"] if call is not None else None
        key = call["effectKey"] if call is not None else f"{t.turn_id}/{index}"
        says, judged = judge.call(
            t.subject, state, call, key=key, name=t.names[index], value=t.value
        )
        calls.append(
            {
                "index": index,
                "effectKey": key,
                "name": t.names[index],
                "record": state or "NOT_STARTED",
                "store": says,
                "verdict": judged,
            }
        )
    return calls


def _observe(
    server: ServerProcess,
    database_url: str,
    store: sqlite_store.Store,
    point: str,
    turns: list[Submitted],
    crashed: bool,
    progress: Progress,
    label: str,
    cancelled: bool = False,
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 120
    pending = {t.turn_id for t in turns}
    seen: dict[str, dict[str, Any]] = {}
    query = _CANCELLED_TURN if cancelled else _TURN
    while pending:
        for turn_id in sorted(pending):
            turn = _gql(server, query, {"id": turn_id})["turn"]
            if _settled(turn, crashed, cancelled):
                seen[turn_id] = turn
                pending.discard(turn_id)
        progress(f"{label}: {len(turns) - len(pending)}/{len(turns)} turns settled")
        if pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"turns not settled in time: {sorted(pending)}")
            time.sleep(0.25)
    judge = _Judge(database_url, store, turns)
    observations = []
    for t in turns:
        calls = _judged_calls(t, seen[t.turn_id]["toolCalls"], judge)
        observation: dict[str, Any] = {
            "point": point,
            "tool": t.subject.tool,
            "kind": t.subject.kind.value,
            "run": t.run,
            "turnId": t.turn_id,
            "status": seen[t.turn_id]["status"],
            "calls": calls,
        }
        if cancelled:
            contradicts, broken = cancel_findings(seen[t.turn_id], CRASHED_CALL)
            held = calls[CRASHED_CALL]
            held["verdict"] = cancel_verdict(held["verdict"], contradicts, broken)
            observation["cancel"] = {"contradicts": contradicts, "broken": broken}
        observations.append(observation)
    return observations


# -- a retry racing reconciliation ---------------------------------------------
def _race_point(cut_at: str) -> str:
    return f"{RACE} ({cut_at})"


def _retry_while_held(
    server: ServerProcess,
    database_url: str,
    store: sqlite_store.Store,
    turns: list[Submitted],
    cut: int,
    progress: Progress,
    label: str,
) -> dict[str, str]:
    """RETRY each turn once it is INTERRUPTED, its call ``cut`` still of
    unknown outcome in the record (the answer is held) and answered in the
    store; then see every retry start. Each turn's retry, by its id."""
    deadline = time.monotonic() + 60
    pending = {t.turn_id: t for t in turns}
    retries: dict[str, str] = {}
    while pending:
        for turn_id, t in sorted(pending.items()):
            turn = _gql(server, _TURN, {"id": turn_id})["turn"]
            if turn["status"] != TurnStatus.INTERRUPTED:
                continue
            state = {c["index"]: c["state"] for c in turn["toolCalls"]}.get(cut)
            if state != ToolCallState.OUTCOME_UNKNOWN:
                raise RuntimeError(
                    f"turn {turn_id}: call {cut} is {state} while its answer is held"
                )
            key = f"{turn_id}/{cut}"
            synthetic = t.subject.tool.startswith("synthetic_")
            if not (
                _synthetic_answered(database_url, [key]) if synthetic else store.answered([key])
            ):
                continue  # the question has not reached the store yet
            answer = _gql(
                server,
                _RETRY,
                {"i": {"turnId": turn_id, "action": "RETRY", "idempotencyKey": f"retry-{turn_id}"}},
            )["resolveInterruptedTurn"]
            if answer["__typename"] != "TurnResolved":
                raise RuntimeError(f"turn {turn_id}: RETRY answered {answer}")
            retries[turn_id] = answer["retry"]["id"]
            del pending[turn_id]
        progress(f"{label}: {len(retries)}/{len(turns)} retries sent, the answers held")
        if pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"turns not interrupted and asked in time: {sorted(pending)}")
            time.sleep(0.25)
    # Running, each retry settles the earlier turn first, and its own
    # question meets the same hold.
    waiting = set(retries.values())
    while waiting:
        for retry_id in sorted(waiting):
            if _gql(server, _TURN, {"id": retry_id})["turn"]["status"] != TurnStatus.QUEUED:
                waiting.discard(retry_id)
        if waiting:
            if time.monotonic() > deadline:
                raise RuntimeError(f"retries not started in time: {sorted(waiting)}")
            time.sleep(0.1)
    progress(f"{label}: {len(retries)}/{len(turns)} retries started; releasing the answers")
    return retries


def _observe_race(
    server: ServerProcess,
    database_url: str,
    store: sqlite_store.Store,
    point: str,
    turns: list[Submitted],
    retries: dict[str, str],
    cut: int,
    progress: Progress,
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 120
    pending = {t.turn_id for t in turns}
    seen: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    while pending:
        for turn_id in sorted(pending):
            # The retry first: everything of the session committed before
            # what this read of it sees (one session's seq is taken in commit
            # order) is then in the read of the original that follows, so a
            # settlement that came before the retry's plan is never missed.
            # Read the other way round, a tool.reconciled committed between
            # the two reads looked like a plan made before any settlement.
            retry = _gql(server, _RACE_TURN, {"id": retries[turn_id]})["turn"]
            original = _gql(server, _RACE_TURN, {"id": turn_id})["turn"]
            # A retry that ran the call before the settlement is a finding
            # already; it may never end (the server's crash point can hold it).
            done = retry["status"] in TERMINAL_STATUSES
            if _settled(original, crashed=True) and (
                done or ran_before_settled(original, retry, cut)
            ):
                seen[turn_id] = (original, retry)
                pending.discard(turn_id)
        progress(f"{point}: {len(turns) - len(pending)}/{len(turns)} turns and retries settled")
        if pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"turns or retries not settled in time: {sorted(pending)}")
            time.sleep(0.25)
    judge = _Judge(database_url, store, turns)
    keys = [c["effectKey"] for pair in seen.values() for turn in pair for c in turn["toolCalls"]]
    applied = {**_synthetic_counts(database_url, keys)}
    for key, n in store.applied_counts(keys).items():
        applied[key] = applied.get(key, 0) + n
    observations = []
    for t in turns:
        original, retry = seen[t.turn_id]
        calls = _judged_calls(t, original["toolCalls"], judge)
        contradicts, broken = race_findings(original, retry, cut, applied)
        again = {c["index"]: c for c in retry["toolCalls"]}.get(cut) or {}
        raced = calls[cut]
        retry_key = again.get("effectKey")
        total = applied.get(raced["effectKey"], 0)
        if retry_key is not None and retry_key != raced["effectKey"]:
            total += applied.get(retry_key, 0)
        raced.update(
            record=f"{raced['record']} then {again.get('state', 'NOT_STARTED')}",
            store=_applied_label(total),
            verdict=race_verdict(contradicts, broken),
            retry={"turnId": retry["id"], "effectKey": retry_key, "state": again.get("state")},
        )
        observations.append(
            {
                "point": point,
                "tool": t.subject.tool,
                "kind": t.subject.kind.value,
                "run": t.run,
                "turnId": t.turn_id,
                "status": original["status"],
                "cut": cut,
                "calls": calls,
                "retry": {"turnId": retry["id"], "status": retry["status"]},
                "race": {"contradicts": contradicts, "broken": broken},
            }
        )
        if contradicts:
            # What a reader needs to see the order the record holds.
            observations[-1]["race"]["events"] = {
                "original": _tool_events(original),
                "retry": _tool_events(retry),
            }
    return observations


def _tool_events(turn: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"seq": e["seq"], "type": e["type"], "data": e["data"]}
        for e in turn["events"]
        if e["type"].startswith("tool.") or e["type"] in ("turn.running", "turn.interrupted")
    ]


def _killed(server: ServerProcess, point: str) -> None:
    try:
        server.proc.wait(60)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the server did not stop at {point}") from None
    if server.proc.returncode != -signal.SIGKILL:
        raise RuntimeError(
            f"the server exited with {server.proc.returncode}, not SIGKILL:\n" + server.log()
        )


def _run(
    url: str, workdir: Path, store: sqlite_store.Store, runs: int, progress: Progress
) -> list[dict[str, Any]]:
    tools = sqlite_store.tools_file(workdir / "tools.toml", store.path)
    count = runs * len(SUBJECTS)
    racing = runs * len(RACE_SUBJECTS)
    observations: list[dict[str, Any]] = []
    raced: list[dict[str, Any]] = []  # shown last
    started: list[ServerProcess] = []

    def start(hooks: Hooks) -> ServerProcess:
        started.append(_start_server(url, workdir, tools, runs, hooks))
        return started[-1]

    def cut_at(point: str, turns: int) -> Hooks:
        return Hooks(f"{point}:{CRASHED_CALL}", turns)

    # The replacements that hold the answers about the racing turns' cut call.
    answers = (workdir / "release-answers-1", workdir / "release-answers-2")
    hold_answers = f"before_reconciled:{CRASHED_CALL}"
    release = workdir / "release-held-calls"
    try:
        progress("starting a server")
        server = start(cut_at(POINTS[0], count))
        for n, point in enumerate(POINTS):
            label = f"crash point {n + 1}/{len(POINTS)} {point}"
            progress(f"{label}: running {count} turns")
            turns = _submit_all(server, store, point, runs)
            racers: list[Submitted] = []
            if point == "after_write":
                racers = _submit_all(
                    server, store, point, runs, subjects=RACE_SUBJECTS, tag="race-write"
                )
            _killed(server, point)
            progress(f"{label}: killed; starting a replacement")
            if n + 1 < len(POINTS):
                following = POINTS[n + 1]
                hooks = cut_at(following, count + (racing if following == "after_write" else 0))
            else:
                # The last server runs the cancelled and control turns, then
                # cuts the after-intent racing turns at a call those never make.
                hooks = Hooks(f"after_intent:{RACE_CUT}", racing, HELD_AT, release)
            if racers:
                hooks = Hooks(hooks.crash_at, hooks.crash_after, hold_answers, answers[0])
            server = start(hooks)
            if racers:
                retries = _retry_while_held(
                    server, url, store, racers, CRASHED_CALL, progress, label
                )
                answers[0].touch()
            observations += _observe(server, url, store, point, turns, True, progress, label)
            if racers:
                raced += _observe_race(
                    server,
                    url,
                    store,
                    _race_point(point),
                    racers,
                    retries,
                    CRASHED_CALL,
                    progress,
                )
        label = CANCELLED
        progress(f"{label}: running {count} turns")
        turns = _submit_all(server, store, CANCELLED, runs, CANCELLED_CALLS)
        _cancel_held(server, turns, progress, label)
        release.touch()  # the held calls go on; later ones are not held
        observations += _observe(
            server, url, store, CANCELLED, turns, False, progress, label, cancelled=True
        )
        label = "no crash (control)"
        progress(f"{label}: running {count} turns")
        turns = _submit_all(server, store, "none", runs)
        observations += _observe(server, url, store, "none", turns, False, progress, label)
        label = _race_point("after_intent")
        progress(f"{label}: running {racing} turns")
        racers = _submit_all(
            server, store, label, runs, RACE_CUT + 1, RACE_SUBJECTS, tag="race-intent"
        )
        _killed(server, label)
        progress(f"{label}: killed; starting a replacement")
        server = start(Hooks(hold_at=f"before_reconciled:{RACE_CUT}", release=answers[1]))
        retries = _retry_while_held(server, url, store, racers, RACE_CUT, progress, label)
        answers[1].touch()
        raced += _observe_race(server, url, store, label, racers, retries, RACE_CUT, progress)
    finally:
        # Stopped before the throwaway database is dropped, even after a failure.
        for each in started:
            each.stop()
    return observations + raced


def run_interruption(
    *, runs: int, database_url: str | None, progress_stream: TextIO
) -> dict[str, Any]:
    progress = Progress(progress_stream)
    workdir = Path(tempfile.mkdtemp(prefix="keyturn-experiment-"))
    started = time.monotonic()
    try:
        store = sqlite_store.Store(workdir / "store.sqlite3")
        with throwaway_database(database_url, prefix="keyturn_experiment") as url:
            observations = _run(url, workdir, store, runs, progress)
    finally:
        progress.done()
        shutil.rmtree(workdir, ignore_errors=True)
    return summarize(observations, runs=runs, seconds=time.monotonic() - started)
