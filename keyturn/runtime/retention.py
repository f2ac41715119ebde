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
from keyturn.runtime.crash import CrashHook
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
    """What one pass of the sweeper did (so far, while it runs)."""

    turns: int = 0
    events: int = 0
    tombstones_made: int = 0
    tombstones_forgotten: int = 0
    batches: int = 0
    busy: int = 0  # batches that found only busy sessions
    seconds: float = 0.0
    left_busy: bool = False  # rows left for the next pass: their sessions stayed busy

    def line(self, *, so_far: bool = False) -> str:
        left = "; some rows left for the next pass (sessions busy)" if self.left_busy else ""
        head = "retention pass in progress" if so_far else "retention pass"
        tail = " so far" if so_far else ""
        return (
            f"{head}: pruned {self.turns} turns ({self.events} events blanked, "
            f"{self.tombstones_made} tombstones made), forgot {self.tombstones_forgotten} "
            f"tombstones, {self.batches} batches in {self.seconds:.2f}s{tail}{left}"
        )

    def fields(self, *, done: bool) -> dict[str, object]:
        """The line's figures as structured fields (``extra=``), for a log
        collector to read without parsing the message."""
        return {
            "pass_done": done,
            "pruned_turns": self.turns,
            "tombstones_made": self.tombstones_made,
            "blanked_events": self.events,
            "forgotten_tombstones": self.tombstones_forgotten,
            "batches": self.batches,
            "busy_batches": self.busy,
            "elapsed_s": round(self.seconds, 3),
            "left_busy": self.left_busy,
        }


@dataclass(frozen=True, slots=True)
class _Batch:
    """What one batch saw and removed."""

    candidates: int
    turns: int = 0
    events: int = 0
    tombstones_made: int = 0
    tombstones_forgotten: int = 0

    @property
    def removed(self) -> int:
        return self.turns + self.tombstones_forgotten


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
    # The events one batch of turns may blank, whatever its turns: the rows
    # (and so the WAL) of a batch stay bounded when turns streamed thousands
    # of events. A turn with more than this is pruned alone.
    batch_events: int = 20_000
    interval_s: float = 60.0
    stats: Stats = field(default_factory=NoStats)
    crash: CrashHook = field(default_factory=CrashHook)
    # After a batch that removed rows the sweeper rests this many times as
    # long as the batch took, leaving the database to admissions meanwhile:
    # its share of one connection's time (and of the database's CPU and WAL)
    # stays near a fifth, and admission keeps its throughput
    # (bench/retention.py). Still hundreds of turns a second.
    rest: float = 4.0
    # A long pass (a backlog) logs a progress line at most this often, so an
    # operator sees it move without a line per batch; a short pass logs only
    # its final line.
    progress_every_s: float = 5.0

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
        left (or what is left sits in sessions that stay busy). Counts each
        batch as it commits, logs a progress line at most every
        ``progress_every_s`` while it runs, and one line at its end."""
        progress = _Progress(self, PassReport(), time.perf_counter(), on_batch)
        if self.policy.prunes:
            await self._turns(progress)
            if self.policy.tombstone_s is not None:
                await self._tombstones(progress)
        report = progress.report
        report.seconds = time.perf_counter() - progress.started
        self.stats.retention_pass()
        log.info(report.line(), extra=report.fields(done=True))
        return report

    async def _turns(self, progress: _Progress) -> None:
        turn_s, key_s = self.policy.turn_s, self.policy.key_s
        assert turn_s is not None and key_s is not None

        async def batch(conn: Conn) -> _Batch:
            done = await db.prune_turns(
                conn,
                turn_retention_s=turn_s,
                key_retention_s=key_s,
                batch=self.batch,
                batch_events=self.batch_events,
            )
            return _Batch(
                done.candidates,
                turns=done.turns,
                events=done.events,
                tombstones_made=done.tombstones,
            )

        await self._drain(batch, progress)

    async def _tombstones(self, progress: _Progress) -> None:
        tombstone_s = self.policy.tombstone_s
        assert tombstone_s is not None

        async def batch(conn: Conn) -> _Batch:
            done = await db.forget_tombstones(
                conn, tombstone_retention_s=tombstone_s, batch=self.batch
            )
            return _Batch(done.candidates, tombstones_forgotten=done.forgotten)

        await self._drain(batch, progress)

    async def _drain(self, batch: Callable[[Conn], Awaitable[_Batch]], progress: _Progress) -> None:
        """``batch`` on a fresh connection, each its own transaction, until it
        finds no candidate."""
        busy = 0
        while True:
            started = time.perf_counter()
            async with connect(self.engine) as conn, conn.driver.transaction():
                done = await batch(conn)
                if done.removed:
                    # Its rows are removed but not committed: a process that
                    # dies here leaves the batch rolled back whole (the test
                    # hook kills it here to show it).
                    await self.crash.point("prune_batch", progress.removing)
            took = time.perf_counter() - started
            progress.batch_done(done)
            if done.candidates == 0:
                return
            if done.removed:
                busy = 0
                # Between batches the sessions just pruned are free again, and
                # a cancel lands here rather than mid-statement.
                await asyncio.sleep(took * self.rest)
                continue
            busy += 1
            if busy >= _BUSY_TRIES:
                progress.report.left_busy = True
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


@dataclass
class _Progress:
    """A pass under way: its report so far, counted and logged batch by batch."""

    sweeper: Sweeper
    report: PassReport
    started: float
    on_batch: OnBatch
    logged: float = field(init=False)
    removing: int = 0  # batches of the pass that removed rows, so far

    def __post_init__(self) -> None:
        self.logged = self.started

    def batch_done(self, done: _Batch) -> None:
        report = self.report
        report.batches += 1
        report.turns += done.turns
        report.events += done.events
        report.tombstones_made += done.tombstones_made
        report.tombstones_forgotten += done.tombstones_forgotten
        if done.candidates and not done.removed:
            report.busy += 1
        now = time.perf_counter()
        report.seconds = now - self.started
        if done.removed:
            self.removing += 1
            # Counted as the batch commits: a scrape during a long pass sees
            # the counters move, and a pass cancelled midway has counted what
            # it did.
            self.sweeper.stats.retention_batch(
                turns=done.turns, events=done.events, tombstones=done.tombstones_forgotten
            )
        if now - self.logged >= self.sweeper.progress_every_s:
            self.logged = now
            log.info(report.line(so_far=True), extra=report.fields(done=False))
        if self.on_batch is not None:
            self.on_batch(report)
