"""A session with a bit of every kind of record: a completed turn that called
tools, a failed one, an interrupted one and its retry (a resolution), for
the tests that delete or move a whole session; and, on a server that asks
for approval, the other keys a session holds: cancels and decisions, of
turns that stay and of turns ready to be pruned."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from keyturn.settings import Settings
from tests.support.client import GraphQLClient
from tests.support.servers import fast_settings

# The interrupted turn's retry runs its input again, a 3 s sleep: under
# fast_settings' 3 s lease a renewal held up for a moment on a busy machine
# would let the sweeper interrupt the retry too. The helper interrupts the
# first run itself (its lease set in the past), so a long lease costs nothing.
RECORDING_LEASE_S = 15.0


def recording_settings(**overrides: Any) -> Settings:
    """Settings for a server that :func:`record_session` records on."""
    return fast_settings(lease_ttl_s=RECORDING_LEASE_S, **overrides)


CANCEL = """
mutation($i: CancelTurnInput!) { cancelTurn(input: $i) {
  __typename
  ... on TurnCancellation { replayed turn { id status } }
  ... on UserError { code message }
  ... on IdempotencyConflict { idempotencyKey existingTurnId }
} }
"""

DECIDE = """
mutation($i: DecideToolCallInput!) { decideToolCall(input: $i) {
  __typename
  ... on ToolCallDecided { index decision replayed turn { id status } }
  ... on UserError { code message }
  ... on IdempotencyConflict { idempotencyKey existingTurnId }
} }
"""

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


@dataclass(frozen=True)
class Decisions:
    # The inputs of a cancelTurn and a decideToolCall, of turns that stay.
    cancel: dict[str, Any]
    decision: dict[str, Any]
    # Every key of the turns ready to be pruned (their own, their cancel's,
    # their decision's) → that turn's id.
    prunable: dict[str, str]


async def _waiting(client: GraphQLClient, turn_id: str, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while True:
        turn = await client.turn(turn_id)
        assert turn is not None
        if turn["status"] == "WAITING":
            return
        assert turn["status"] in {"QUEUED", "RUNNING"}, turn
        assert time.monotonic() < deadline, turn
        await asyncio.sleep(0.05)


async def _cancelled(client: GraphQLClient, sid: str, key: str, input: str) -> dict[str, Any]:
    """A turn that waits for approval, cancelled under ``key``: the cancel's input."""
    tid = (await client.submit(sid, key, input))["turn"]["id"]
    await _waiting(client, tid)
    asked = {"turnId": tid, "idempotencyKey": f"{key}: cancel", "reason": "not now"}
    answer = (await client.execute(CANCEL, {"i": asked}))["cancelTurn"]
    assert answer["__typename"] == "TurnCancellation", answer
    assert answer["turn"]["status"] == "CANCELLED"
    return asked


async def _approved(client: GraphQLClient, sid: str, key: str, input: str) -> dict[str, Any]:
    """A turn whose one call waited for approval, approved under a key and
    run to its end: the decision's input."""
    tid = (await client.submit(sid, key, input))["turn"]["id"]
    await _waiting(client, tid)
    asked = {"turnId": tid, "index": 0, "decision": "APPROVE", "idempotencyKey": f"{key}: ok"}
    answer = (await client.execute(DECIDE, {"i": asked}))["decideToolCall"]
    assert answer["__typename"] == "ToolCallDecided", answer
    await client.wait_for_status(tid, {"COMPLETED"})
    return asked


async def record_decisions(client: GraphQLClient, db: Any, session_id: str) -> Decisions:
    """On a server that asks for approval of unsafe calls: two turns with a
    cancel and two with a decision, each under its own key. One of each is
    moved two days into the past, for a pass with a turn retention of a day
    to prune; then only the session's keys still hold their cancel's and
    decision's keys."""
    old_cancel = await _cancelled(client, session_id, "old cancelled", "/append a=1")
    old_decision = await _approved(client, session_id, "old approved", "/append b=2")
    cancel = await _cancelled(client, session_id, "cancelled", "/append c=3")
    decision = await _approved(client, session_id, "approved", "/append d=4")
    await db.execute(
        "UPDATE turns SET completed_at = now() - interval '2 days' WHERE id = ANY($1::uuid[])",
        [old_cancel["turnId"], old_decision["turnId"]],
    )
    prunable = {
        "old cancelled": old_cancel["turnId"],
        old_cancel["idempotencyKey"]: old_cancel["turnId"],
        "old approved": old_decision["turnId"],
        old_decision["idempotencyKey"]: old_decision["turnId"],
    }
    return Decisions(cancel, decision, prunable)


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
