"""A Hypothesis state machine over the tool ledger: turns of keyed
IDEMPOTENT ``/write`` calls are stopped at a chosen point of a chosen call
(before or after the store applied it), interrupted, and retried while the
interrupting process settles the unknown call, in one of four orders: the
settlement first, the retry first (the store is locked so the question
waits), both at once, or with every answer held at ``before_reconciled``
until the retry was sent. A retry may itself be stopped and retried.

Everything runs through the real server, worker, ledger and store; the
test only moves the process's crash hook (as ``KEYTURN_CRASH_AT`` and
``KEYTURN_HOLD_AT`` would) and takes leases away. After every step: no
effect key has two rows in the store, no name is applied twice along a
chain, and once the chain completed every name is applied exactly once; a
call's recorded state agrees with the store (COMPLETED and
RECONCILED_APPLIED applied, RECONCILED_NOT_APPLIED settled as never,
NOT_STARTED absent); no two intents per call and epoch; and an earlier
turn's call is settled before its retry plans the call of that index."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from keyturn.runtime.crash import CrashHook
from keyturn.runtime.tool_runner import ToolRunner
from tests import figures
from tests.support import GraphQLClient, admin, fast_settings, serve_in_process

pytestmark = pytest.mark.slow

T = TypeVar("T")

POINTS = ("before_intent", "after_intent", "after_write", "after_result")
ORDERS = ("settle_first", "retry_first", "at_once", "held")

CALLS = """
query($id: ID!) { turn(id: $id) {
  id status retryOf
  toolCalls { index kind state effectKey reusedFrom }
} }
"""

RESOLVE = """
mutation($i: ResolveInterruptedTurnInput!) { resolveInterruptedTurn(input: $i) {
  __typename
  ... on TurnResolved { replayed retry { id } }
} }
"""


@dataclass
class Chain:
    """An original turn and its retries, the last one the newest."""

    session: str
    names: list[str]
    turns: list[str] = field(default_factory=list)
    # What the last turn was stopped at (point, index); None once it ended.
    stopped: tuple[str, int] | None = None
    retry_keys: dict[str, str] = field(default_factory=dict)  # turn -> its RETRY's key

    @property
    def last(self) -> str:
        return self.turns[-1]


def runs_again(point: str, index: int, calls: int) -> list[int]:
    """The calls a retry of a turn stopped at (point, index) runs itself (and
    so reaches the crash hook's points): the reused ones do not."""
    first = index if point in ("before_intent", "after_intent") else index + 1
    return list(range(first, calls))


class Harness:
    """The server's loop and its parts, for a state machine in another thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        client: GraphQLClient,
        db: Any,
        database_url: str,
        runner: ToolRunner,
        tmp: Path,
    ) -> None:
        self.loop, self.client, self.db = loop, client, db
        self.database_url = database_url
        self.runner = runner
        self.hook: CrashHook = runner.crash
        self.tmp = tmp
        self.releases = itertools.count()

    def run(self, coro: Coroutine[Any, Any, T], within: float = 90) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(within)

    # -- the crash hook, moved as the environment would set it --------------
    async def stop_at(self, point: str, index: int, start: Coroutine[Any, Any, str]) -> str:
        """Run ``start`` (it submits or retries a turn) with the hook set to
        hold calls at (point, index) forever; return its turn once one call
        reached that point, and take the hook away again."""
        hits = self.hook.hits
        self.hook.after = 10**9  # never kill: hold there until the lease is lost
        self.hook.point_name, self.hook.index = point, index
        try:
            turn = await start
            deadline = time.monotonic() + 20
            while self.hook.hits == hits:
                assert time.monotonic() < deadline, f"turn {turn} never reached {point}:{index}"
                await asyncio.sleep(0.02)
            return turn
        finally:
            self.hook.point_name, self.hook.index = None, None

    async def take_over(self, turn_id: str) -> None:
        """Another owner took the turn: the holder's renewal is refused and
        the lease is past, so a sweep interrupts it and settles its calls."""
        await self.db.execute(
            "UPDATE turns SET epoch = epoch + 1, lease_until = now() - interval '1 second' "
            "WHERE id = $1::uuid",
            turn_id,
        )

    async def status(self, turn_id: str) -> str:
        t = await self.calls(turn_id)
        return str(t["status"])

    async def calls(self, turn_id: str) -> dict[str, Any]:
        data = await self.client.execute(CALLS, {"id": turn_id})
        assert data["turn"] is not None
        result: dict[str, Any] = data["turn"]
        return result

    async def wait_status(self, turn_id: str, statuses: set[str], within: float = 20) -> str:
        deadline = time.monotonic() + within
        while (status := await self.status(turn_id)) not in statuses:
            assert time.monotonic() < deadline, f"turn {turn_id} stuck in {status}"
            await asyncio.sleep(0.01)
        return status

    async def settled(self, turn_id: str, within: float = 20) -> None:
        deadline = time.monotonic() + within
        while True:
            t = await self.calls(turn_id)
            unknown = [
                c
                for c in t["toolCalls"]
                if c["state"] == "OUTCOME_UNKNOWN" and c["kind"] == "IDEMPOTENT"
            ]
            if t["status"] == "INTERRUPTED" and not unknown:
                return
            assert time.monotonic() < deadline, t
            await asyncio.sleep(0.05)

    async def resolve(self, turn_id: str, key: str) -> dict[str, Any]:
        payload = {"turnId": turn_id, "action": "RETRY", "idempotencyKey": key}
        data = await self.client.execute(RESOLVE, {"i": payload})
        result: dict[str, Any] = data["resolveInterruptedTurn"]
        assert result["__typename"] == "TurnResolved", result
        return result

    async def retry(self, turn_id: str, key: str) -> str:
        return str((await self.resolve(turn_id, key))["retry"]["id"])

    # -- one interruption and its retry, in the order chosen ----------------
    async def interrupt_and_retry(
        self, chain: Chain, order: str, key: str, then: tuple[str, int] | None
    ) -> str:
        """Interrupt the chain's last turn and RETRY it in ``order``; ``then``
        wraps the retry (it holds it at a point) or is None (it runs on)."""
        old = chain.last
        assert chain.stopped is not None
        index = chain.stopped[1]

        async def send() -> str:
            return await self.retry(old, key)

        async def retried() -> str:
            if then is None:
                return await send()
            return await self.stop_at(then[0], then[1], send())

        if order == "settle_first":
            await self.take_over(old)
            await self.settled(old)
            new = await retried()
        elif order == "retry_first":
            # The store is slow: every question about the key waits on a lock.
            blocker: Any = await admin(self.database_url)
            try:
                lock = blocker.transaction()
                await lock.start()
                await blocker.execute("LOCK TABLE synthetic_effects IN ACCESS EXCLUSIVE MODE")
                try:
                    await self.take_over(old)
                    await self.wait_status(old, {"INTERRUPTED"})
                    pending = asyncio.create_task(retried())
                    await asyncio.sleep(0.3)  # the retry is settling its earlier call now
                finally:
                    await lock.rollback()
            finally:
                await blocker.close()
            new = await pending
        elif order == "at_once":
            await self.take_over(old)
            await self.wait_status(old, {"INTERRUPTED"})
            # A second question beside the sweep's own, and the retry's.
            _, new = await asyncio.gather(self.runner.reconcile(uuid.UUID(old)), retried())
        else:
            release = self.tmp / f"release-{next(self.releases)}"
            self.hook.hold_until = release
            self.hook.hold_name, self.hook.hold_index = "before_reconciled", index
            try:
                await self.take_over(old)
                await self.wait_status(old, {"INTERRUPTED"})
                pending = asyncio.create_task(retried())
                await asyncio.sleep(0.3)  # the retry is settling, held too
            finally:
                release.touch()
                self.hook.hold_name, self.hook.hold_index = None, None
            new = await pending
        await self.settled(old)
        return new

    # -- what the record and the store say -----------------------------------
    async def store(self) -> dict[str, list[bool]]:
        rows = await self.db.fetch(
            "SELECT effect_key, applied FROM synthetic_effects WHERE tool = 'synthetic_write' "
            "ORDER BY id"
        )
        found: dict[str, list[bool]] = {}
        for r in rows:
            found.setdefault(r["effect_key"], []).append(bool(r["applied"]))
        return found

    async def applied_names(self) -> dict[str, int]:
        rows = await self.db.fetch(
            "SELECT name, count(*) AS n FROM synthetic_effects "
            "WHERE tool = 'synthetic_write' AND applied GROUP BY name"
        )
        return {r["name"]: int(r["n"]) for r in rows}


def machine(h: Harness, steps: list[int]) -> type[RuleBasedStateMachine]:
    class Ledger(RuleBasedStateMachine):
        stopped = Bundle("stopped")

        def __init__(self) -> None:
            super().__init__()
            self.chains: list[Chain] = []

        def open_chains(self) -> int:
            return sum(c.stopped is not None for c in self.chains)

        # Two turns stopped at once at most: the steps go to retrying them.
        @precondition(lambda self: self.open_chains() < 2)
        @rule(
            target=stopped,
            calls=st.integers(1, 3),
            point=st.sampled_from(POINTS),
            at=st.integers(0, 2),
        )
        def start(self, calls: int, point: str, at: int) -> Chain:
            """A turn of ``calls`` keyed writes, stopped at ``point`` of one of them."""
            steps[0] += 1
            index = at % calls
            n = len(self.chains)
            tag = uuid.uuid4().hex[:6]
            names = [f"n{tag}{n}x{k}" for k in range(calls)]
            text = " ".join(f"/write {name}={k}" for k, name in enumerate(names))

            async def begin() -> Chain:
                sid = await h.client.create_session()

                async def submit() -> str:
                    accepted = await h.client.submit(sid, "w", text + " then reply")
                    return str(accepted["turn"]["id"])

                chain = Chain(sid, names)
                chain.turns.append(await h.stop_at(point, index, submit()))
                chain.stopped = (point, index)
                return chain

            chain = h.run(begin())
            self.chains.append(chain)
            return chain

        @rule(
            target=stopped,
            chain=consumes(stopped),
            order=st.sampled_from(ORDERS),
            stop_again=st.none() | st.tuples(st.sampled_from(POINTS), st.integers(0, 2)),
        )
        def retry(self, chain: Chain, order: str, stop_again: tuple[str, int] | None) -> Any:
            """Interrupt the chain's last turn and RETRY it in ``order``; the
            retry runs to its end, or is stopped again at a call it runs."""
            steps[0] += 1
            assert chain.stopped is not None
            point, index = chain.stopped
            runnable = runs_again(point, index, len(chain.names))
            then: tuple[str, int] | None = None
            if stop_again is not None and runnable:
                then = (stop_again[0], runnable[stop_again[1] % len(runnable)])
            key = f"r-{uuid.uuid4().hex[:8]}"

            async def go() -> str:
                new = await h.interrupt_and_retry(chain, order, key, then)
                if then is None:
                    status = await h.wait_status(new, {"COMPLETED", "FAILED", "INTERRUPTED"})
                    assert status == "COMPLETED", (chain, status)
                return new

            old = chain.last
            new = h.run(go())
            chain.retry_keys[old] = key
            chain.turns.append(new)
            chain.stopped = then
            if then is not None:
                return multiple(chain)  # stopped again: it can be retried again
            applied = h.run(h.applied_names())
            # The chain completed: each of its writes is in the store once.
            assert [applied.get(n, 0) for n in chain.names] == [1] * len(chain.names)
            return multiple()

        @precondition(lambda self: any(c.retry_keys for c in self.chains))
        @rule()
        def replay_a_retry(self) -> None:
            """The same RETRY again: the same retry, nothing new."""
            retried = [(c, t, k) for c in self.chains for t, k in c.retry_keys.items()]
            steps[0] += 1
            chain, turn, key = retried[-1]

            async def replay() -> dict[str, Any]:
                before = await h.db.fetchval("SELECT count(*) FROM turns")
                result = await h.resolve(turn, key)
                assert await h.db.fetchval("SELECT count(*) FROM turns") == before
                return result

            result = h.run(replay())
            assert result["replayed"] is True
            assert result["retry"]["id"] == chain.turns[chain.turns.index(turn) + 1]

        @invariant()
        def record_agrees_with_store(self) -> None:
            if not self.chains:
                return
            h.run(check(h, self.chains))

        def teardown(self) -> None:
            # Every turn left stopped is interrupted and settled; the record
            # must then agree with the store everywhere.
            async def finish() -> None:
                for chain in self.chains:
                    if chain.stopped is not None:
                        await h.take_over(chain.last)
                        await h.settled(chain.last)
                        chain.stopped = None
                if self.chains:
                    await check(h, self.chains)

            h.run(finish())

    return Ledger


async def check(h: Harness, chains: list[Chain]) -> None:
    store = await h.store()
    # At most one row per effect key: applied once, or settled as never.
    assert all(len(rows) == 1 for rows in store.values()), store
    applied = await h.applied_names()
    for chain in chains:
        # Along a chain no name is applied twice; all once when it completed.
        counts = [applied.get(n, 0) for n in chain.names]
        assert all(c <= 1 for c in counts), (chain, counts)
        for turn in chain.turns:
            t = await h.calls(turn)
            for call in t["toolCalls"]:
                rows = store.get(call["effectKey"], [])
                state = call["state"]
                if state in ("COMPLETED", "RECONCILED_APPLIED"):
                    assert rows == [True], (turn, call, rows)
                elif state == "RECONCILED_NOT_APPLIED":
                    assert rows == [False], (turn, call, rows)
                elif state == "NOT_STARTED":
                    assert rows == [], (turn, call, rows)
        last = await h.calls(chain.last)
        if last["status"] == "COMPLETED":
            assert counts == [1] * len(chain.names), (chain, counts)
    turns = [t for c in chains for t in c.turns]
    twice = await h.db.fetchval(
        """SELECT count(*) FROM (
             SELECT 1 FROM events WHERE type = 'tool.intent' AND turn_id = ANY($1::uuid[])
             GROUP BY turn_id, data ->> 'epoch', data ->> 'index' HAVING count(*) > 1) x""",
        turns,
    )
    assert twice == 0
    # An earlier turn's call with an intent is settled (its result or its
    # reconciliation) before the retry plans the call of that index.
    early = await h.db.fetch(
        """SELECT r.id::text AS retry, i.data ->> 'index' AS index,
                  (SELECT min(s.seq) FROM events s
                    WHERE s.turn_id = r.retry_of AND s.type IN ('tool.result', 'tool.reconciled')
                      AND s.data ->> 'index' = i.data ->> 'index') AS settled_at,
                  (SELECT min(p.seq) FROM events p
                    WHERE p.turn_id = r.id AND p.type = 'tool.planned'
                      AND (p.data ->> 'index')::int <= (i.data ->> 'index')::int) AS planned_at
           FROM turns r JOIN events i ON i.turn_id = r.retry_of AND i.type = 'tool.intent'
           WHERE r.id = ANY($1::uuid[])""",
        turns,
    )
    for row in early:
        if row["planned_at"] is None:
            continue  # the retry has not planned that call (yet)
        assert row["settled_at"] is not None and row["settled_at"] < row["planned_at"], dict(row)


async def test_the_ledger_settles_before_a_retry_reuses_or_runs_again(
    database_url: str, db: Any, tmp_path: Path
) -> None:
    steps = [0]
    async with serve_in_process(database_url, fast_settings()) as srv:
        client = GraphQLClient(srv.url)
        runner = srv.app.state.runtime.worker.runner
        harness = Harness(asyncio.get_running_loop(), client, db, database_url, runner, tmp_path)
        try:
            await asyncio.to_thread(
                run_state_machine_as_test,
                machine(harness, steps),
                settings=settings(
                    max_examples=6,
                    stateful_step_count=8,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                ),
            )
        finally:
            await client.close()
    figures.add("fuzz inputs tried", steps[0])
