"""`keyturn export` and `keyturn import` as real processes: a session moved to
another database answers there as here (the same replays, the same turn ids,
the same conflicts, the same KeyExpired, down to the keys that cancelled or
decided a turn since pruned); a tenant's sessions move in one file;
importing twice changes nothing; a conflicting or cut file is refused whole,
in one line."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from keyturn.db.engine import create_engine
from keyturn.ops import databases
from keyturn.runtime.auth import create_token
from tests.acceptance.clirun import clean_env, keyturn, on_a_terminal, one_clean_line
from tests.support import GraphQLClient, InProcessServer, admin, serve_in_process
from tests.support.recorded import (
    CANCEL,
    DECIDE,
    RESOLVE,
    Decisions,
    Recorded,
    record_decisions,
    record_session,
    recording_settings,
    rows_of_session,
)

pytestmark = pytest.mark.slow

EVENTS = """query($id: ID!) { session(id: $id) { eventCount defaultHistory
  events(first: 100) { edges { node { seq type turnId data } } }
  turns(first: 100) { edges { node { id status input output error idempotencyKey retryOf
    toolCalls { index tool state } } } } } }"""


SUBMIT = """
mutation($i: SubmitTurnInput!) { submitTurn(input: $i) {
  __typename
  ... on TurnAdmission { replayed turn { id status output } }
  ... on IdempotencyConflict { idempotencyKey existingTurnId }
  ... on KeyExpired { code idempotencyKey turnId expiredAt }
  ... on UserError { code message }
} }
"""

# A pass with these prunes the turns record_decisions moved two days back.
RETENTION = {"KEYTURN_KEY_RETENTION": "1h", "KEYTURN_TURN_RETENTION": "1d"}


@pytest.fixture
async def server(database_url: str) -> AsyncIterator[InProcessServer]:
    """The source Keyturn: unsafe calls wait for approval (decideToolCall)."""
    async with serve_in_process(database_url, recording_settings(approve_unsafe=True)) as srv:
        yield srv


@pytest.fixture
async def second_database_url(server_url: str, template_db: str) -> AsyncIterator[str]:
    """Another Keyturn's database: migrated, empty, on the same server."""
    name = databases.new_name("keyturn_t2")
    url = await databases.create_database(server_url, name, template=template_db)
    yield url
    await databases.drop_database(server_url, name)


async def run(url: str, cwd: Path, *args: str, **settings: str) -> Any:
    """The command, off the event loop (the in-process server lives on it)."""
    env = {"KEYTURN_DATABASE_URL": url, **settings}
    return await asyncio.to_thread(lambda: keyturn(*args, cwd=cwd, timeout=90, **env))


def records(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    return path


async def exported(recorded: Recorded, url: str, tmp_path: Path) -> Path:
    out = tmp_path / "session.jsonl"
    done = await run(url, tmp_path, "export", "--session", recorded.session_id, "--out", str(out))
    assert done.returncode == 0, done.stderr
    # 4 + 4 turns recorded, 2 of them pruned to tombstones; 12 keys.
    assert f"exported session {recorded.session_id}: 6 turns" in done.stderr
    assert "2 tombstones, 12 keys" in done.stderr
    return out


async def all_rows(url: str) -> dict[str, int]:
    conn = await admin(url)
    try:
        tables = ("sessions", "turns", "events", "resolutions", "key_tombstones", "session_keys")
        return {t: int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in tables}
    finally:
        await conn.close()


async def record(
    client: GraphQLClient, db: Any, url: str, tmp_path: Path
) -> tuple[Recorded, Decisions]:
    """The recorded session, its cancels and decisions, and a retention pass
    (`keyturn prune`) that prunes two of those turns to tombstones."""
    recorded = await record_session(client, db)
    decisions = await record_decisions(client, db, recorded.session_id)
    pruned = await run(url, tmp_path, "prune", **RETENTION)
    assert pruned.returncode == 0, pruned.stderr
    assert "pruned 2 turns" in pruned.stdout and "2 tombstones made" in pruned.stdout
    return recorded, decisions


async def answers(client: GraphQLClient, recorded: Recorded, decisions: Decisions) -> list[Any]:
    """What the session's keys answer when used again, each with what it
    should be. None of these requests writes anything where the keys are
    held; a key that is not would admit, cancel or decide anew."""
    sid = recorded.session_id
    said: list[Any] = []

    async def submit(key: str, text: str) -> dict[str, Any]:
        data = await client.execute(
            SUBMIT, {"i": {"sessionId": sid, "idempotencyKey": key, "input": text}}
        )
        said.append(data["submitTurn"])
        return dict(data["submitTurn"])

    for key, (text, tid) in recorded.turns.items():
        replay = await submit(key, text)
        assert replay["__typename"] == "TurnReplayed" and replay["turn"]["id"] == tid, replay
        changed = await submit(key, text + " (changed)")
        assert changed["__typename"] == "IdempotencyConflict", changed
        assert changed["existingTurnId"] == tid
    resolve = {"turnId": recorded.interrupted_turn_id, "action": "RETRY"}
    decided = (
        await client.execute(RESOLVE, {"i": {**resolve, "idempotencyKey": recorded.retry_key}})
    )["resolveInterruptedTurn"]
    assert decided["__typename"] == "TurnResolved" and decided["replayed"] is True
    assert decided["retry"]["id"] == recorded.retry_turn_id
    said.append(decided)

    cancel = decisions.cancel
    again = (await client.execute(CANCEL, {"i": cancel}))["cancelTurn"]
    assert again["__typename"] == "TurnCancellation" and again["replayed"] is True, again
    other = (await client.execute(CANCEL, {"i": {**cancel, "reason": "another"}}))["cancelTurn"]
    assert other["__typename"] == "IdempotencyConflict", other
    assert other["existingTurnId"] == cancel["turnId"]
    said += [again, other]

    decision = decisions.decision
    again = (await client.execute(DECIDE, {"i": decision}))["decideToolCall"]
    assert again["__typename"] == "ToolCallDecided" and again["replayed"] is True, again
    other = (await client.execute(DECIDE, {"i": {**decision, "decision": "REJECT"}}))[
        "decideToolCall"
    ]
    assert other["__typename"] == "IdempotencyConflict", other
    said += [again, other]

    # The pruned turns: their own keys are spent; the keys of their cancel
    # and decision still name them, though nothing else of them is left.
    for key, tid in decisions.prunable.items():
        answer = await submit(key, "a new turn?")
        if key.endswith((": cancel", ": ok")):
            assert answer["__typename"] == "IdempotencyConflict", (key, answer)
            assert answer["existingTurnId"] == tid
        else:
            assert answer["__typename"] == "KeyExpired", (key, answer)
            assert answer["turnId"] == tid
    return said


async def test_a_session_moved_to_another_database_replays_there_as_here(
    client: GraphQLClient, db: Any, database_url: str, second_database_url: str, tmp_path: Path
) -> None:
    recorded, decisions = await record(client, db, database_url, tmp_path)
    sid = recorded.session_id
    here = await client.execute(EVENTS, {"id": sid})
    said_here = await answers(client, recorded, decisions)
    path = await exported(recorded, database_url, tmp_path)

    lines = records(path)
    kinds = [line["kind"] for line in lines]
    assert kinds[:2] == ["keyturn.export", "session"] and kinds[-1] == "end"
    assert lines[0] == {"kind": "keyturn.export", "version": 2, "tenant": "", "sessions": 1}
    events = [line for line in lines if line["kind"] == "event"]
    assert [e["seq"] for e in events] == list(range(1, here["session"]["eventCount"] + 1))
    assert {"tool.planned", "tool.intent", "tool.result"} <= {e["type"] for e in events}
    turns = {line["idempotency_key"]: line for line in lines if line["kind"] == "turn"}
    assert turns["tools"]["fingerprint"] and turns["tools"]["id"] == recorded.turns["tools"][1]
    stones = {line["idempotency_key"] for line in lines if line["kind"] == "tombstone"}
    assert stones == {"old cancelled", "old approved"}
    keys = {
        line["idempotency_key"]: (line["key_kind"], line["turn_id"])
        for line in lines
        if line["kind"] == "key"
    }
    assert len(keys) == 12 and keys["again"] == ("RESOLUTION", recorded.interrupted_turn_id)
    assert keys["old cancelled: cancel"] == ("CANCEL", decisions.prunable["old cancelled"])
    assert keys["old approved: ok"] == ("DECISION", decisions.prunable["old approved"])
    # The same bytes on stdout as in the file.
    streamed = await run(database_url, tmp_path, "export", "--session", sid)
    assert streamed.returncode == 0 and streamed.stdout.encode() == path.read_bytes()

    loaded = await run(second_database_url, tmp_path, "import", str(path))
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith(f"imported session {sid}")

    async with serve_in_process(second_database_url) as there_server:
        there = GraphQLClient(there_server.url)
        try:
            assert await there.execute(EVENTS, {"id": sid}) == here
            assert await answers(there, recorded, decisions) == said_here
            # The counter came along: a new turn there takes the next seq.
            new = await there.submit(sid, "new there", "hello")
            assert new["__typename"] == "TurnAccepted"
            await there.wait_for_status(new["turn"]["id"], {"COMPLETED"})
            after = await there.session(sid)
            seqs = [e["node"]["seq"] for e in after["events"]["edges"]]
            assert seqs == list(range(1, after["eventCount"] + 1))
            first_new = after["events"]["edges"][here["session"]["eventCount"]]["node"]
            assert first_new["type"] == "turn.started"
            assert first_new["turnId"] == new["turn"]["id"]
        finally:
            await there.close()


async def test_importing_twice_is_a_no_op_and_a_conflict_is_refused_whole(
    client: GraphQLClient,
    db: Any,
    database_url: str,
    second_database_url: str,
    server_url: str,
    template_db: str,
    tmp_path: Path,
) -> None:
    recorded, decisions = await record(client, db, database_url, tmp_path)
    sid = recorded.session_id
    path = await exported(recorded, database_url, tmp_path)
    assert (await run(second_database_url, tmp_path, "import", str(path))).returncode == 0
    before = await all_rows(second_database_url)

    again = await run(second_database_url, tmp_path, "import", str(path))
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"session {sid} already present")
    assert await all_rows(second_database_url) == before

    lines = records(path)
    # The same session with a turn that says something else.
    changed = [
        {**line, "output": "another reply"} if line.get("idempotency_key") == "tools" else line
        for line in lines
    ]
    refused = await run(
        second_database_url, tmp_path, "import", str(write(tmp_path / "c", changed))
    )
    line = one_clean_line(refused)
    assert line.startswith("keyturn: import refused, nothing was written: ")
    assert f"session {sid} already exists here with another record" in line
    assert recorded.turns["tools"][1] in line and "(output)" in line
    # The key of a pruned turn's cancel, said to name another turn.
    pruned_cancel = "old cancelled: cancel"
    moved = [
        {**line, "turn_id": decisions.cancel["turnId"]}
        if line["kind"] == "key" and line["idempotency_key"] == pruned_cancel
        else line
        for line in lines
    ]
    refused = await run(second_database_url, tmp_path, "import", str(write(tmp_path / "k", moved)))
    line = one_clean_line(refused)
    assert f"key {pruned_cancel} differs here (turn_id)" in line
    # A new session that reuses the turn ids of one already here.
    other = str(uuid.uuid4())
    renamed = [
        orjson.loads(orjson.dumps(line).replace(sid.encode(), other.encode())) for line in lines
    ]
    refused = await run(
        second_database_url, tmp_path, "import", str(write(tmp_path / "r", renamed))
    )
    line = one_clean_line(refused)
    assert "already exists here, in another session" in line
    async with databases.throwaway(server_url, prefix="keyturn_t3", template=template_db) as third:
        # A file cut short, into a database that has never seen the session.
        cut = await run(third, tmp_path, "import", str(write(tmp_path / "cut", lines[:-3])))
        assert "without its last line" in one_clean_line(cut)
        # Keys that disagree with the record: the kept cancel's key left out.
        kept_cancel = decisions.cancel["idempotencyKey"]
        dropped = [
            {**line, "key": line["key"] - 1} if line["kind"] == "end" else line
            for line in lines
            if not (line["kind"] == "key" and line["idempotency_key"] == kept_cancel)
        ]
        refused = await run(third, tmp_path, "import", str(write(tmp_path / "d", dropped)))
        line = one_clean_line(refused)
        assert f"the record implies key {kept_cancel!r}" in line
        assert await all_rows(third) == {t: 0 for t in before}

        # A file of version 1 (one session, no keys) is still read: its keys
        # are rebuilt from its record, which lacks the two of the pruned
        # turns' cancel and decision.
        v1 = [
            {"kind": "keyturn.session", "version": 1, "sessionId": sid},
            *(line for line in lines[1:-1] if line["kind"] != "key"),
            {k: v for k, v in lines[-1].items() if k != "key"},
        ]
        old = write(tmp_path / "v1", v1)
        loaded = await run(third, tmp_path, "import", str(old))
        assert loaded.returncode == 0, loaded.stderr
        assert loaded.stdout.startswith(f"imported session {sid}")
        assert (await all_rows(third))["session_keys"] == 10
        again = await run(third, tmp_path, "import", str(old))
        assert again.stdout.startswith(f"session {sid} already present"), again.stderr
    assert await all_rows(second_database_url) == before
    assert (await rows_of_session(db, sid))["turns"] == 6  # the source is untouched


async def test_export_refuses_an_unknown_session_and_a_running_turn(
    client: GraphQLClient, database_url: str, tmp_path: Path
) -> None:
    unknown = str(uuid.uuid4())
    out = tmp_path / "x.jsonl"
    missing = await run(database_url, tmp_path, "export", "--session", unknown, "--out", str(out))
    assert f"no session {unknown} in tenant ''" in one_clean_line(missing)
    # No file, not even a partial one.
    assert await asyncio.to_thread(lambda: sorted(tmp_path.iterdir())) == []

    sid = await client.create_session()
    # Long enough to still run when two exports have started on a busy
    # machine (3 s was not, once).
    tid = (await client.submit(sid, "slow", "/sleep 15000 busy"))["turn"]["id"]
    await client.wait_for_status(tid, {"RUNNING"})
    busy = await run(database_url, tmp_path, "export", "--session", sid)
    line = one_clean_line(busy)
    assert "RUNNING turn" in line and tid in line and busy.stdout == ""
    # The tenant's export too, whichever of its sessions runs a turn.
    busy = await run(database_url, tmp_path, "export", "--tenant", "")
    line = one_clean_line(busy)
    assert f"session {sid} has a RUNNING turn" in line and busy.stdout == ""
    await client.wait_for_status(tid, {"COMPLETED"}, within=30)

    nobody = await run(database_url, tmp_path, "export", "--tenant", "nobody")
    assert "no sessions in tenant 'nobody'" in one_clean_line(nobody)
    neither = await run(database_url, tmp_path, "export")
    assert "--session ID, or --tenant NAME" in one_clean_line(neither)


async def token_of(database_url: str, tenant: str) -> str:
    """A new API token of ``tenant`` in that database."""
    engine = create_engine(database_url, pool_size=1)
    try:
        return await create_token(engine, name=f"{tenant}-{uuid.uuid4().hex[:8]}", tenant=tenant)
    finally:
        await engine.dispose()


def client_of(url: str, token: str) -> GraphQLClient:
    client = GraphQLClient(url)
    client.http.headers["Authorization"] = f"Bearer {token}"
    return client


async def test_a_tenants_sessions_move_in_one_file_all_or_nothing(
    server: InProcessServer,
    database_url: str,
    second_database_url: str,
    server_url: str,
    template_db: str,
    tmp_path: Path,
) -> None:
    acme = client_of(server.url, await token_of(database_url, "acme"))
    other = client_of(server.url, await token_of(database_url, "other"))
    moved: dict[str, tuple[str, str, str]] = {}  # session → (key, input, turn id)
    try:
        for key, text in (("first", "/write colour=red"), ("second", "hello")):
            sid = await acme.create_session()
            tid = (await acme.submit(sid, key, text))["turn"]["id"]
            await acme.wait_for_status(tid, {"COMPLETED"})
            moved[sid] = (key, text, tid)
        theirs = await other.create_session()
        tid = (await other.submit(theirs, "first", "hello"))["turn"]["id"]
        await other.wait_for_status(tid, {"COMPLETED"})
    finally:
        await acme.close()
        await other.close()

    path = tmp_path / "acme.jsonl"
    done = await run(database_url, tmp_path, "export", "--tenant", "acme", "--out", str(path))
    assert done.returncode == 0, done.stderr
    assert "exported tenant 'acme': 2 sessions, 2 turns" in done.stderr
    lines = records(path)
    assert lines[0] == {"kind": "keyturn.export", "version": 2, "tenant": "acme", "sessions": 2}
    # Oldest first, each whole before the next; the other tenant's is not there.
    assert [line["id"] for line in lines if line["kind"] == "session"] == list(moved)
    assert [line["kind"] for line in lines].count("end") == 2
    assert theirs not in path.read_text()

    loaded = await run(second_database_url, tmp_path, "import", str(path))
    assert loaded.returncode == 0, loaded.stderr
    said = loaded.stdout.splitlines()
    assert [line.split(" (")[0] for line in said[:2]] == [f"imported session {s}" for s in moved]
    assert said[2].startswith("2 sessions (") and said[2].endswith("2 imported, 0 already present")
    before = await all_rows(second_database_url)
    assert before["sessions"] == 2 and before["turns"] == 2

    again = await run(second_database_url, tmp_path, "import", str(path))
    assert again.returncode == 0, again.stderr
    said = again.stdout.splitlines()
    assert [line.split(" (")[0] for line in said[:2]] == [
        f"session {s} already present" for s in moved
    ]
    assert said[2].endswith("0 imported, 2 already present")
    assert await all_rows(second_database_url) == before

    token = await token_of(second_database_url, "acme")
    async with serve_in_process(second_database_url) as there_server:
        there = client_of(there_server.url, token)
        try:
            for sid, (key, text, tid) in moved.items():
                replay = await there.submit(sid, key, text)
                assert replay["__typename"] == "TurnReplayed", replay
                assert replay["turn"]["id"] == tid
        finally:
            await there.close()

    # One transaction for the whole file: a whole first session is not kept
    # when the second is cut short, nor when the file ends before it.
    first_end = [line["kind"] for line in lines].index("end")
    async with databases.throwaway(server_url, prefix="keyturn_t3", template=template_db) as third:
        cut = await run(third, tmp_path, "import", str(write(tmp_path / "cut", lines[:-1])))
        assert "without its last line" in one_clean_line(cut)
        short = write(tmp_path / "short", lines[: first_end + 1])
        cut = await run(third, tmp_path, "import", str(short))
        assert "after 1 of its 2 sessions (cut short?)" in one_clean_line(cut)
        assert await all_rows(third) == {t: 0 for t in before}


async def test_on_a_terminal_export_and_import_draw_their_progress_and_the_file_stays_json_lines(
    client: GraphQLClient, database_url: str, second_database_url: str, tmp_path: Path
) -> None:
    sid = await client.create_session()
    for key, text in (("first", "/write colour=red"), ("second", "/stream 3 1 hello")):
        tid = (await client.submit(sid, key, text))["turn"]["id"]
        await client.wait_for_status(tid, {"COMPLETED"})
    out = tmp_path / "session.jsonl"

    code, screen = await asyncio.to_thread(
        on_a_terminal,
        ["export", "--session", sid, "--out", str(out)],
        clean_env(KEYTURN_DATABASE_URL=database_url),
        tmp_path,
    )
    assert code == 0, screen
    lines = records(out)  # every line of the file is one JSON object
    n = len(lines)
    assert lines[0]["kind"] == "keyturn.export" and lines[-1]["kind"] == "end"
    assert {"session", "turn", "event"} <= {line["kind"] for line in lines}
    # Drawn over itself (a carriage return) up to the whole file, then the
    # summary on a line of its own; none of the record on the screen.
    drawn = re.findall(rf"\rexporting session {sid}: (\d+)/{n} lines", screen)
    assert drawn and drawn[-1] == str(n), screen
    assert f"{n}/{n} lines\r\nexported session {sid}: " in screen, screen
    assert '"kind"' not in screen

    code, screen = await asyncio.to_thread(
        on_a_terminal,
        ["import", str(out)],
        clean_env(KEYTURN_DATABASE_URL=second_database_url),
        tmp_path,
    )
    assert code == 0, screen
    drawn = re.findall(rf"\rimporting {re.escape(str(out))}: (\d+) lines\r\n", screen)
    # The count starts after the header line, which is read first.
    assert len(drawn) == 1 and n - 1 <= int(drawn[0]) <= n, screen
    assert re.search(r" lines\r\nimported session " + sid + r" \(", screen), screen
    assert await all_rows(second_database_url) == await all_rows(database_url)
