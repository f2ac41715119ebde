"""A session with a bit of every kind of record: a completed turn that called
tools, a failed one, an interrupted one and its retry (a resolution), for
the tests that delete or move a whole session."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from tests.support.client import GraphQLClient

RESOLVE = """
mutation($i: ResolveInterruptedTurnInput!) { resolveInterruptedTurn(input: $i) {
  __typename
  ... on TurnResolved { replayed retry { id } }
  ... on UserError { code message }
} }
"""


@dataclass(frozen=True)
class Recorded:
    session_id: str
    # key → (input, turn id) of every submitted turn
    turns: dict[str, tuple[str, str]]
    interrupted_turn_id: str
    retry_key: str
    retry_turn_id: str


async def _wait_events(db: Any, turn_id: str, n: int, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while await db.fetchval("SELECT count(*) FROM events WHERE turn_id = $1::uuid", turn_id) < n:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def record_session(client: GraphQLClient, db: Any) -> Recorded:
    sid = await client.create_session()
    turns: dict[str, tuple[str, str]] = {}
    for key, text in (("tools", "/write colour=blue /read colour"), ("fails", "/fail")):
        tid = (await client.submit(sid, key, text))["turn"]["id"]
        turns[key] = (text, tid)
        await client.wait_for_status(tid, {"COMPLETED", "FAILED"})
    # Interrupted: another owner takes the running turn's lease, which is past.
    text = "/sleep 3000 cut short"
    cut = (await client.submit(sid, "cut", text))["turn"]["id"]
    turns["cut"] = (text, cut)
    await client.wait_for_status(cut, {"RUNNING"})
    await _wait_events(db, cut, 2)
    await db.execute(
        "UPDATE turns SET epoch = epoch + 1, lease_until = now() - interval '1 second' "
        "WHERE id = $1::uuid",
        cut,
    )
    await client.wait_for_status(cut, {"INTERRUPTED"})
    data = await client.execute(
        RESOLVE, {"i": {"turnId": cut, "action": "RETRY", "idempotencyKey": "again"}}
    )
    answer = data["resolveInterruptedTurn"]
    assert answer["__typename"] == "TurnResolved", answer
    retry = answer["retry"]["id"]
    await client.wait_for_status(retry, {"COMPLETED"}, within=30)
    return Recorded(sid, turns, cut, "again", retry)


async def rows_of_session(db: Any, session_id: str) -> dict[str, int]:
    """Rows naming the session, in every table with a session_id column (and
    the session itself): whatever table is added later is counted too."""
    tables = [
        r["table_name"]
        for r in await db.fetch(
            "SELECT table_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND column_name = 'session_id' ORDER BY table_name"
        )
    ]
    found = {
        t: int(
            await db.fetchval(f'SELECT count(*) FROM "{t}" WHERE session_id = $1::uuid', session_id)
        )
        for t in tables
    }
    found["sessions"] = int(
        await db.fetchval("SELECT count(*) FROM sessions WHERE id = $1::uuid", session_id)
    )
    return found
