"""`keyturn export` and `keyturn import` as real processes: a session moved to
another database answers there as here (the same replays, the same turn ids,
the same conflicts); importing twice changes nothing; a conflicting or cut
file is refused whole, in one line."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from keyturn.ops import databases
from tests.acceptance.clirun import keyturn, one_clean_line
from tests.support import GraphQLClient, admin, serve_in_process
from tests.support.recorded import RESOLVE, Recorded, record_session, rows_of_session

pytestmark = pytest.mark.slow

EVENTS = """query($id: ID!) { session(id: $id) { eventCount defaultHistory
  events(first: 100) { edges { node { seq type turnId data } } }
  turns(first: 100) { edges { node { id status input output error idempotencyKey retryOf
    toolCalls { index tool state } } } } } }"""


@pytest.fixture
async def second_database_url(server_url: str, template_db: str) -> AsyncIterator[str]:
    """Another Keyturn's database: migrated, empty, on the same server."""
    name = databases.new_name("keyturn_t2")
    url = await databases.create_database(server_url, name, template=template_db)
    yield url
    await databases.drop_database(server_url, name)


async def run(url: str, cwd: Path, *args: str) -> Any:
    """The command, off the event loop (the in-process server lives on it)."""
    return await asyncio.to_thread(keyturn, *args, cwd=cwd, KEYTURN_DATABASE_URL=url)


def records(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    return path


async def exported(recorded: Recorded, url: str, tmp_path: Path) -> Path:
    out = tmp_path / "session.jsonl"
    done = await run(url, tmp_path, "export", "--session", recorded.session_id, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert f"exported session {recorded.session_id}: 4 turns" in done.stderr
    return out


async def all_rows(url: str) -> dict[str, int]:
    conn = await admin(url)
    try:
        tables = ("sessions", "turns", "events", "resolutions", "key_tombstones")
        return {t: int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in tables}
    finally:
        await conn.close()


async def test_a_session_moved_to_another_database_replays_there_as_here(
    client: GraphQLClient, db: Any, database_url: str, second_database_url: str, tmp_path: Path
) -> None:
    recorded = await record_session(client, db)
    sid = recorded.session_id
    here = await client.execute(EVENTS, {"id": sid})
    path = await exported(recorded, database_url, tmp_path)

    lines = records(path)
    kinds = [line["kind"] for line in lines]
    assert kinds[:2] == ["keyturn.session", "session"] and kinds[-1] == "end"
    assert lines[0]["version"] == 1 and lines[0]["sessionId"] == sid
    events = [line for line in lines if line["kind"] == "event"]
    assert [e["seq"] for e in events] == list(range(1, here["session"]["eventCount"] + 1))
    assert {"tool.planned", "tool.intent", "tool.result"} <= {e["type"] for e in events}
    turns = {line["idempotency_key"]: line for line in lines if line["kind"] == "turn"}
    assert turns["tools"]["fingerprint"] and turns["tools"]["id"] == recorded.turns["tools"][1]
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
            for key, (text, tid) in recorded.turns.items():
                replay = await there.submit(sid, key, text)
                assert replay["__typename"] == "TurnReplayed", replay
                assert replay["turn"]["id"] == tid
                changed = await there.submit(sid, key, text + " (changed)")
                assert changed["__typename"] == "IdempotencyConflict"
                assert changed["existingTurnId"] == tid
            decided = await there.execute(
                RESOLVE,
                {
                    "i": {
                        "turnId": recorded.interrupted_turn_id,
                        "action": "RETRY",
                        "idempotencyKey": recorded.retry_key,
                    }
                },
            )
            answer = decided["resolveInterruptedTurn"]
            assert answer["__typename"] == "TurnResolved" and answer["replayed"] is True
            assert answer["retry"]["id"] == recorded.retry_turn_id
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
    recorded = await record_session(client, db)
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
    # A file cut short, into a database that has never seen the session.
    async with databases.throwaway(server_url, prefix="keyturn_t3", template=template_db) as third:
        cut = await run(third, tmp_path, "import", str(write(tmp_path / "cut", lines[:-3])))
        assert "without its last line" in one_clean_line(cut)
        assert await all_rows(third) == {t: 0 for t in before}
    assert await all_rows(second_database_url) == before
    assert (await rows_of_session(db, sid))["turns"] == 4  # the source is untouched


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
    tid = (await client.submit(sid, "slow", "/sleep 3000 busy"))["turn"]["id"]
    await client.wait_for_status(tid, {"RUNNING"})
    busy = await run(database_url, tmp_path, "export", "--session", sid)
    line = one_clean_line(busy)
    assert "RUNNING turn" in line and tid in line and busy.stdout == ""
    await client.wait_for_status(tid, {"COMPLETED"})
