"""A Hypothesis state machine drives submitTurn against a model of the rules:
a new key is a new turn, the same key and effective request is a replay, the
same key with another input or history is a conflict. After every step the
database holds exactly the model's turns and one ``turn.started`` each.

Decisions on waiting tool calls (``/append`` under KEYTURN_APPROVE_UNSAFE)
follow the same rules, and one more: the first key to decide a call wins,
every other key answers ToolCallAlreadyDecided with that decision. After
every step each call holds at most one decision, the model's.

Cancels too: a cancel's key replays its answer for the same turn and
reason and conflicts otherwise, a turn takes one cancel, and the keys of
cancels and of turns share the session's one namespace. After every step the
record holds exactly the model's cancel keys, and no turn ends twice."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from keyturn.db.engine import asyncpg_dsn
from tests import figures
from tests.support import MUTATION_SUBMIT, start_server_process, stop_process

pytestmark = pytest.mark.slow

TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),  # no lone surrogates
    min_size=1,
    max_size=40,
)
HISTORY = st.sampled_from([None, "FULL", "NONE"])
DECISION = st.sampled_from(["APPROVE", "REJECT"])
NOTE = st.sampled_from([None, "ok", "no"])
REASON = st.sampled_from([None, "", "stop", "changed my mind"])

CANCEL = """
mutation($i: CancelTurnInput!) { cancelTurn(input: $i) {
  __typename
  ... on TurnCancellation { replayed turn { id } }
  ... on TurnAlreadyCancelled { turnId }
  ... on TurnNotCancellable { turnId }
  ... on IdempotencyConflict { existingTurnId }
} }
"""

DECIDE = """
mutation($i: DecideToolCallInput!) { decideToolCall(input: $i) {
  __typename
  ... on ToolCallDecided { decision replayed }
  ... on ToolCallAlreadyDecided { decision }
  ... on IdempotencyConflict { existingTurnId }
} }
"""


def effective(history: str | None) -> str:
    return history or "FULL"  # the session's default


def machine(base_url: str, database_url: str, steps: list[int]) -> type[RuleBasedStateMachine]:
    class Admission(RuleBasedStateMachine):
        keys = Bundle("keys")
        calls = Bundle("calls")
        decision_keys = Bundle("decision_keys")
        cancel_keys = Bundle("cancel_keys")

        def __init__(self) -> None:
            super().__init__()
            self.http = httpx.Client(base_url=base_url, timeout=30)
            self.model: dict[str, tuple[str, str, str]] = {}  # key -> (input, history, turn)
            # Decision keys -> (turn, decision, note); turns -> their one decision.
            self.decisions: dict[str, tuple[str, str, str | None]] = {}
            self.decided: dict[str, str] = {}
            # Cancel keys -> (turn, reason); turns -> the key of their one cancel.
            self.cancels: dict[str, tuple[str, str | None]] = {}
            self.cancelled: dict[str, str] = {}

        def submit(self, key: str, text: str, history: str | None) -> dict[str, Any]:
            steps[0] += 1
            payload: dict[str, Any] = {"sessionId": self.sid, "idempotencyKey": key, "input": text}
            if history is not None:
                payload["history"] = history
            body = self.http.post(
                "/graphql", json={"query": MUTATION_SUBMIT, "variables": {"input": payload}}
            ).json()
            assert not body.get("errors"), body
            result: dict[str, Any] = body["data"]["submitTurn"]
            return result

        @initialize()
        def session(self) -> None:
            body = self.http.post(
                "/graphql", json={"query": "mutation { createSession { id } }"}
            ).json()
            self.sid = body["data"]["createSession"]["id"]

        @rule(target=keys, text=TEXT, history=HISTORY)
        def new_key(self, text: str, history: str | None) -> str:
            key = f"k-{uuid.uuid4().hex[:10]}"
            result = self.submit(key, text, history)
            assert result["__typename"] == "TurnAccepted", result
            self.model[key] = (text, effective(history), result["turn"]["id"])
            return key

        @rule(key=keys, history=HISTORY)
        def replay(self, key: str, history: str | None) -> None:
            text, hist, turn = self.model[key]
            result = self.submit(key, text, history)
            if effective(history) == hist:
                assert result["__typename"] == "TurnReplayed", result
                assert result["turn"]["id"] == turn
            else:
                assert result["__typename"] == "IdempotencyConflict", result
                assert result["existingTurnId"] == turn

        @rule(key=keys, other=TEXT, history=HISTORY)
        def conflict(self, key: str, other: str, history: str | None) -> None:
            text, _hist, turn = self.model[key]
            if other == text:
                other = text + "!"
            result = self.submit(key, other, history)
            assert result["__typename"] == "IdempotencyConflict", result
            assert result["existingTurnId"] == turn

        def graphql(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
            body = self.http.post("/graphql", json={"query": query, "variables": variables}).json()
            assert not body.get("errors"), body
            data: dict[str, Any] = body["data"]
            return data

        @rule(target=calls)
        def waiting_call(self) -> str:
            """A turn of its own session that waits on its one call."""
            sid = self.graphql("mutation { createSession { id } }", {})["createSession"]["id"]
            payload = {"sessionId": sid, "idempotencyKey": "w", "input": "/append a=1"}
            turn = self.graphql(MUTATION_SUBMIT, {"input": payload})["submitTurn"]["turn"]["id"]
            deadline = time.monotonic() + 20
            query = "query($id: ID!) { turn(id: $id) { status } }"
            while self.graphql(query, {"id": turn})["turn"]["status"] != "WAITING":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            return str(turn)

        def decide(self, turn: str, decision: str, key: str, note: str | None) -> dict[str, Any]:
            payload = {"turnId": turn, "index": 0, "decision": decision, "idempotencyKey": key}
            if note is not None:
                payload["note"] = note
            result: dict[str, Any] = self.graphql(DECIDE, {"i": payload})["decideToolCall"]
            return result

        @rule(target=decision_keys, turn=calls, decision=DECISION, note=NOTE)
        def new_decision(self, turn: str, decision: str, note: str | None) -> str:
            key = f"d-{uuid.uuid4().hex[:10]}"
            result = self.decide(turn, decision, key, note)
            if turn in self.decided:
                assert result == {
                    "__typename": "ToolCallAlreadyDecided",
                    "decision": self.decided[turn],
                }
            else:
                assert result == {
                    "__typename": "ToolCallDecided",
                    "decision": decision,
                    "replayed": False,
                }
                self.decided[turn] = decision
                self.decisions[key] = (turn, decision, note)
            return key

        @rule(key=decision_keys, decision=DECISION, note=NOTE)
        def decision_again(self, key: str, decision: str, note: str | None) -> None:
            if key not in self.decisions:
                return  # a key whose decision lost: it names nothing
            turn, first, first_note = self.decisions[key]
            result = self.decide(turn, decision, key, note)
            if (decision, note or "") == (first, first_note or ""):
                assert result == {
                    "__typename": "ToolCallDecided",
                    "decision": first,
                    "replayed": True,
                }
            else:
                assert result == {"__typename": "IdempotencyConflict", "existingTurnId": turn}

        @invariant()
        def one_decision_per_call(self) -> None:
            if not self.decided:
                return

            async def decided() -> dict[str, str]:
                conn: Any = await asyncpg.connect(asyncpg_dsn(database_url))
                try:
                    rows = await conn.fetch(
                        """SELECT turn_id::text AS t, data ->> 'decision' AS d FROM events
                           WHERE type IN ('tool.approved', 'tool.rejected')
                             AND turn_id = ANY($1::uuid[])""",
                        list(self.decided),
                    )
                    assert len(rows) == len({r["t"] for r in rows})
                    return {r["t"]: r["d"] for r in rows}
                finally:
                    await conn.close()

            assert asyncio.run(decided()) == self.decided

        def cancel(self, turn: str, key: str, reason: str | None) -> dict[str, Any]:
            steps[0] += 1
            payload: dict[str, Any] = {"turnId": turn, "idempotencyKey": key}
            if reason is not None:
                payload["reason"] = reason
            result: dict[str, Any] = self.graphql(CANCEL, {"i": payload})["cancelTurn"]
            return result

        @rule(target=cancel_keys, of=keys, reason=REASON)
        def new_cancel(self, of: str, reason: str | None) -> str:
            turn = self.model[of][2]
            key = f"c-{uuid.uuid4().hex[:10]}"
            result = self.cancel(turn, key, reason)
            if turn in self.cancelled:
                # It has its cancel; or it got to its end before stopping.
                assert result["__typename"] in {"TurnAlreadyCancelled", "TurnNotCancellable"}
                assert result["turnId"] == turn
            elif result["__typename"] == "TurnCancellation":
                assert (result["replayed"], result["turn"]["id"]) == (False, turn)
                self.cancels[key] = (turn, reason)
                self.cancelled[turn] = key
            else:
                assert result == {"__typename": "TurnNotCancellable", "turnId": turn}
            return key

        @rule(key=cancel_keys, reason=REASON)
        def cancel_again(self, key: str, reason: str | None) -> None:
            if key not in self.cancels:
                return  # a key whose cancel wrote nothing: it names nothing
            turn, first = self.cancels[key]
            result = self.cancel(turn, key, reason)
            if reason == first:
                assert result == {
                    "__typename": "TurnCancellation",
                    "replayed": True,
                    "turn": {"id": turn},
                }
            else:
                assert result == {"__typename": "IdempotencyConflict", "existingTurnId": turn}

        @rule(key=cancel_keys, text=TEXT)
        def cancel_key_submitted(self, key: str, text: str) -> None:
            if key not in self.cancels:
                return
            result = self.submit(key, text, None)
            assert result["__typename"] == "IdempotencyConflict", result
            assert result["existingTurnId"] == self.cancels[key][0]

        @rule(key=keys, of=keys)
        def turn_key_as_cancel_key(self, key: str, of: str) -> None:
            result = self.cancel(self.model[of][2], key, None)
            assert result == {
                "__typename": "IdempotencyConflict",
                "existingTurnId": self.model[key][2],
            }

        @invariant()
        def cancels_match_model(self) -> None:
            if not hasattr(self, "sid"):
                return

            async def recorded() -> tuple[dict[str, str], int]:
                conn: Any = await asyncpg.connect(asyncpg_dsn(database_url))
                try:
                    keys = await conn.fetch(
                        """SELECT id::text AS t, cancel_key AS k FROM turns
                           WHERE session_id = $1::uuid AND cancel_key IS NOT NULL""",
                        self.sid,
                    )
                    twice = await conn.fetchval(
                        """SELECT count(*) FROM (
                             SELECT turn_id FROM events
                             WHERE session_id = $1::uuid
                               AND type IN ('turn.completed', 'turn.failed', 'turn.cancelled',
                                            'turn.interrupted')
                             GROUP BY turn_id HAVING count(*) > 1) x""",
                        self.sid,
                    )
                    return {r["t"]: r["k"] for r in keys}, int(twice)
                finally:
                    await conn.close()

            assert asyncio.run(recorded()) == (self.cancelled, 0)

        @rule(key=consumes(keys))
        def forget(self, key: str) -> None:
            """A key leaves the bundle; the model still counts its turn."""

        @invariant()
        def record_matches_model(self) -> None:
            if not hasattr(self, "sid"):
                return

            async def counts() -> tuple[int, int]:
                conn: Any = await asyncpg.connect(asyncpg_dsn(database_url))
                try:
                    row = await conn.fetchrow(
                        """SELECT (SELECT count(*) FROM turns WHERE session_id = $1::uuid) AS t,
                                  (SELECT count(*) FROM events WHERE session_id = $1::uuid
                                     AND type = 'turn.started') AS s""",
                        self.sid,
                    )
                    return int(row["t"]), int(row["s"])
                finally:
                    await conn.close()

            assert asyncio.run(counts()) == (len(self.model), len(self.model))

        def teardown(self) -> None:
            self.http.close()

    return Admission


async def test_submissions_follow_the_rules_of_a_model(database_url: str, tmp_path: Path) -> None:
    server = start_server_process(
        database_url, tmp_path, name="stateful", env={"KEYTURN_APPROVE_UNSAFE": "true"}
    )
    steps = [0]
    try:
        await asyncio.to_thread(
            run_state_machine_as_test,
            machine(server.url, database_url, steps),
            settings=settings(
                max_examples=25,
                stateful_step_count=15,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        stop_process(server)
    figures.add("stateful submissions checked against the model", steps[0])
