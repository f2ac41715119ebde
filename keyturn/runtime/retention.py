"""The record's lifetime: the published retention policy, and the sweeper
that prunes what the policy lets go.

Three retentions, each counted from the moment before it (and forever by
default, as the record was before):

- **key** (KEYTURN_KEY_RETENTION): how long after its turn ended a key
  answers replays. Judged at admission on the database clock
  (:mod:`keyturn.db.admission`), never by the sweeper: an expired key answers
  KeyExpired whether or not anything was pruned yet.
- **turn** (KEYTURN_TURN_RETENTION, at least the key retention): how long
  after it ended a turn keeps its input, output and event data. Then the
  sweeper leaves a tombstone for its key (:mod:`keyturn.db.retention`).
- **tombstone** (KEYTURN_TOMBSTONE_RETENTION): how long after its turn was
  pruned a tombstone is kept. Then the key is forgotten: a submission with it
  is a new turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from keyturn.db import retention as db
from keyturn.db.engine import Conn, Engine, connect
from keyturn.errors import DatabaseUnavailable
from keyturn.runtime.stats import NoStats, Stats
from keyturn.settings import Settings, format_retention

log = logging.getLogger(__name__)

# A batch that found only sessions busy with admissions is tried again after
# this long, at most this many times in a pass; what is left waits for the
# next pass.
_BUSY_WAIT_S = 0.05
_BUSY_TRIES = 20


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """The three retentions in seconds; None is forever."""

    key_s: int | None = None
    turn_s: int | None = None
    tombstone_s: int | None = None

    @classmethod
    def of(cls, settings: Settings) -> RetentionPolicy:
        return cls(settings.key_retention, settings.turn_retention, settings.tombstone_retention)

    @property
    def problem(self) -> str | None:
        """Why this policy cannot be kept, or None. A turn must outlive its
        key's replays: a pruned turn cannot be replayed."""
        if self.turn_s is None:
            return None
        if self.key_s is None:
            return (
                f"KEYTURN_TURN_RETENTION ({format_retention(self.turn_s)}) needs "
                "KEYTURN_KEY_RETENTION: keys answer replays forever, so their turns must stay"
            )
        if self.turn_s < self.key_s:
            return (
                f"KEYTURN_TURN_RETENTION ({format_retention(self.turn_s)}) must be at least "
                f"KEYTURN_KEY_RETENTION ({format_retention(self.key_s)}): a key that still "
                "answers replays needs its turn"
            )
        return None

    @property
    def prunes(self) -> bool:
        """Whether the sweeper has anything to do under this policy."""
        return self.turn_s is not None and self.problem is None

    def lines(self) -> list[str]:
        """The policy for a person, as ``keyturn doctor`` prints it."""
        key = (
            "keys answer replays forever"
            if self.key_s is None
            else f"a key answers replays until {format_retention(self.key_s)} after its turn "
            "ended, then KeyExpired"
        )
        if self.turn_s is None:
            turn = "turns are kept forever"
        else:
            turn = (
                f"turns are pruned {format_retention(self.turn_s)} after they ended, leaving a "
                "tombstone for their key"
            )
        if self.turn_s is None:
            stone = "no tombstones are made"
        elif self.tombstone_s is None:
            stone = "tombstones are kept forever: a key is never reused"
        else:
            stone = (
                f"tombstones are forgotten {format_retention(self.tombstone_s)} after their turn "
                "was pruned: after that, the same key names a new turn"
            )
        return [key, turn, stone]


@dataclass
class PassReport:
    """What one pass of the sweeper did."""

    turns: int = 0
    events: int = 0
    tombstones_made: int = 0
    tombstones_forgotten: int = 0
    batches: int = 0
    busy: int = 0  # batches that found only busy sessions
    seconds: float = 0.0
    left_busy: bool = False  # rows left for the next pass: their sessions stayed busy

    def line(self) -> str:
        left = "; some rows left for the next pass (sessions busy)" if self.left_busy else ""
        return (
            f"retention pass: pruned {self.turns} turns ({self.events} events blanked, "
            f"{self.tombstones_made} tombstones made), forgot {self.tombstones_forgotten} "
            f"tombstones, {self.batches} batches in {self.seconds:.2f}s{left}"
        )


# Called after every batch with the pass so far (``keyturn prune``'s progress).
OnBatch = Callable[[PassReport], None] | None


@dataclass(frozen=True, slots=True)
class Preview:
    """What a pass would remove now (``keyturn prune --dry-run``)."""

    turns: db.Span
    events: int
    tombstones: db.Span


@dataclass
class Sweeper:
    engine: Engine
    policy: RetentionPolicy
    batch: int = 200
    interval_s: float = 60.0
    stats: Stats = field(default_factory=NoStats)
    # After a batch that removed rows the sweeper rests this many times as
    # long as the batch took, leaving the database to admissions meanwhile:
    # its share of one connection's time (and of the database's CPU and WAL)
    # stays near a fifth, and admission keeps its throughput
    # (bench/retention.py). Still hundreds of turns a second.
    rest: float = 4.0

    async def run_forever(self) -> None:
        """A pass every ``interval_s`` (supervised): a database that does not
        answer costs one pass, logged; the next pass resumes from the record."""
        while True:
            try:
                await self.run_pass()
            except DatabaseUnavailable:
                log.warning("retention pass stopped: the database did not answer")
            await asyncio.sleep(self.interval_s)

    async def run_pass(self, on_batch: OnBatch = None) -> PassReport:
        """Prune what the policy lets go, batch by batch, until nothing is
        left (or what is left sits in sessions that stay busy). Logs one line."""
        report = PassReport()
        started = time.perf_counter()
        if self.policy.prunes:
            await self._turns(report, on_batch)
            if self.policy.tombstone_s is not None:
                await self._tombstones(report, on_batch)
        report.seconds = time.perf_counter() - started
        self.stats.retention_pass(
            turns=report.turns, events=report.events, tombstones=report.tombstones_forgotten
        )
        log.info(
            report.line(),
            extra={
                "pruned_turns": report.turns,
                "blanked_events": report.events,
                "forgotten_tombstones": report.tombstones_forgotten,
                "batches": report.batches,
            },
        )
        return report

    async def _turns(self, report: PassReport, on_batch: OnBatch) -> None:
        turn_s, key_s = self.policy.turn_s, self.policy.key_s
        assert turn_s is not None and key_s is not None

        async def batch(conn: Conn) -> tuple[int, int]:
            done = await db.prune_turns(
                conn, turn_retention_s=turn_s, key_retention_s=key_s, batch=self.batch
            )
            report.turns += done.turns
            report.events += done.events
            report.tombstones_made += done.tombstones
            return done.candidates, done.turns

        await self._drain(batch, report, on_batch)

    async def _tombstones(self, report: PassReport, on_batch: OnBatch) -> None:
        tombstone_s = self.policy.tombstone_s
        assert tombstone_s is not None

        async def batch(conn: Conn) -> tuple[int, int]:
            done = await db.forget_tombstones(
                conn, tombstone_retention_s=tombstone_s, batch=self.batch
            )
            report.tombstones_forgotten += done.forgotten
            return done.candidates, done.forgotten

        await self._drain(batch, report, on_batch)

    async def _drain(
        self,
        batch: Callable[[Conn], Awaitable[tuple[int, int]]],
        report: PassReport,
        on_batch: OnBatch,
    ) -> None:
        """``batch`` (candidates seen, rows removed) on a fresh connection,
        each its own transaction, until it finds no candidate."""
        busy = 0
        while True:
            started = time.perf_counter()
            async with connect(self.engine) as conn:
                candidates, removed = await batch(conn)
            took = time.perf_counter() - started
            report.batches += 1
            if on_batch is not None:
                on_batch(report)
            if candidates == 0:
                return
            if removed:
                busy = 0
                # Between batches the sessions just pruned are free again, and
                # a cancel lands here rather than mid-statement.
                await asyncio.sleep(took * self.rest)
                continue
            report.busy += 1
            busy += 1
            if busy >= _BUSY_TRIES:
                report.left_busy = True
                return
            await asyncio.sleep(_BUSY_WAIT_S)

    async def preview(self) -> Preview:
        """What a pass would remove now; reads only."""
        nothing = db.Span(0, None, None)
        turns, events, stones = nothing, 0, nothing
        async with connect(self.engine) as conn:
            if self.policy.prunes:
                assert self.policy.turn_s is not None
                turns, events = await db.preview_turns(conn, turn_retention_s=self.policy.turn_s)
                if self.policy.tombstone_s is not None:
                    stones = await db.preview_tombstones(
                        conn, tombstone_retention_s=self.policy.tombstone_s
                    )
        return Preview(turns, events, stones)
