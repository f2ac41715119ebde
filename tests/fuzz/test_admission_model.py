"""A Hypothesis state machine drives submitTurn against a model of the rules:
a new key is a new turn, the same key and effective request is a replay, the
same key with another input or history is a conflict. After every step the
database holds exactly the model's turns and one ``turn.started`` each."""

from __future__ import annotations

import asyncio
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


def effective(history: str | None) -> str:
    return history or "FULL"  # the session's default


def machine(base_url: str, database_url: str, steps: list[int]) -> type[RuleBasedStateMachine]:
    class Admission(RuleBasedStateMachine):
        keys = Bundle("keys")

        def __init__(self) -> None:
            super().__init__()
            self.http = httpx.Client(base_url=base_url, timeout=30)
            self.model: dict[str, tuple[str, str, str]] = {}  # key -> (input, history, turn)

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
    server = start_server_process(database_url, tmp_path, name="stateful")
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
