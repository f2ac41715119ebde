"""Running turns: claim from the queue, hold a lease, call the model, record the end.

Any process may run any queued turn. A claim is one short statement that sets
the owner, a lease on the database clock and a new epoch; no row stays locked
while the model works. The owner renews the leases of all its turns in one
statement per tick, and turns that end together are finished by one
(:mod:`keyturn.runtime.finisher`); every later write names the epoch, so a
worker whose lease passed on has its writes refused (and the refusal
recorded). A lease that runs out marks its turn INTERRUPTED: Keyturn never
runs a turn a second time on its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field

from keyturn.db import cancels, deltas, leases, reads
from keyturn.db.engine import Engine, connect
from keyturn.db.records import TurnRecord
from keyturn.domain import EventType, History, TurnStatus
from keyturn.errors import (
    AwaitingApproval,
    CancelRequested,
    DatabaseUnavailable,
    ModelError,
    StaleLease,
    ToolOutcomeUnknown,
)
from keyturn.runtime.approval import ApprovalPolicy
from keyturn.runtime.bus import EventBus
from keyturn.runtime.cancel import CancelSignal
from keyturn.runtime.crash import CrashHook
from keyturn.runtime.finisher import Finisher
from keyturn.runtime.ledger import tool_calls
from keyturn.runtime.model import Model, PastTurn, ToolOutcome
from keyturn.runtime.output import DeltaRecorder, Output
from keyturn.runtime.tool_runner import ToolRunner
from keyturn.runtime.tools import Tools
from keyturn.waits import set_within

log = logging.getLogger(__name__)


_END_EVENT = {
    TurnStatus.COMPLETED: EventType.TURN_COMPLETED,
    TurnStatus.FAILED: EventType.TURN_FAILED,
    TurnStatus.CANCELLED: EventType.TURN_CANCELLED,
}


# Settling unknown tool outcomes is retried with a backoff between these bounds.
_SETTLE_FIRST_DELAY_S = 0.5
_SETTLE_MAX_DELAY_S = 30.0
# How long a hand-back at a clean stop is retried through a lost connection.
_RELEASE_RETRY_S = 5.0


def new_owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class _Running:
    turn: TurnRecord
    task: asyncio.Task[None] | None = None
    # Its renewal was refused: another owner, or the sweep, has the turn.
    lease_lost: bool = False
    # The model is producing its reply (a lost lease cancels the task then).
    replying: bool = False
    cancel: CancelSignal = field(default_factory=CancelSignal)
    checking_cancel: bool = False  # a read of the turn's cancel is under way
    # The turn ended in the record (finished or handed back), not left to its lease.
    ended: bool = False
    # When its lease runs out unless renewed first (the loop's clock): for the log.
    lease_deadline: float = 0.0

    def lose_lease(self) -> None:
        """The record has refused the turn's renewal: its writes would be
        refused too, so the reply still under way is cancelled (its task
        learns why from ``lease_lost``). An end already being written goes
        on, to be refused by its fence."""
        self.lease_lost = True
        if self.replying and self.task is not None:
            self.task.cancel()

    def took_back_lease_cancel(self) -> bool:
        """In the turn's task: whether the cancel it caught is the lost
        lease's alone (then it is taken back, and the turn left to its
        lease), not a stop's, which must go on."""
        task = asyncio.current_task()
        if not self.lease_lost or task is None or task.cancelling() > 1:
            return False
        task.uncancel()
        return True


@dataclass(frozen=True)
class WorkerSettings:
    max_running: int
    lease_ttl_s: float
    lease_renew_s: float
    claim_poll_s: float
    shutdown_grace_s: float
    # How long a woken claim waits for the wake-ups that follow (see run()).
    claim_debounce_s: float = 0.0
    max_tool_rounds: int = 8
    tool_timeout_s: float = 30.0
    # At most one turn.delta per this interval while a model streams.
    delta_flush_s: float = 0.1
    # Earlier turns a FULL history reads at most (the latest ones).
    history_max_turns: int = 50


class Worker:
    def __init__(
        self,
        *,
        engine: Engine,
        model: Model,
        bus: EventBus,
        settings: WorkerSettings,
        owner: str,
        tools: Tools | None = None,
        crash: CrashHook | None = None,
        approval: ApprovalPolicy | None = None,
    ) -> None:
        self.engine = engine
        self.model = model
        self.bus = bus
        self.settings = settings
        self.owner = owner
        # Runs the model's tool calls and writes the tool ledger.
        self.runner = ToolRunner(
            engine=engine,
            model=model,
            bus=bus,
            tools=tools or Tools([]),
            crash=crash or CrashHook(),
            lease_ttl_s=settings.lease_ttl_s,
            owner=owner,
            max_rounds=settings.max_tool_rounds,
            tool_timeout_s=settings.tool_timeout_s,
            approval=approval,
        )
        # Settling runs beside the claim loop, never in it: a slow tool answer
        # must not keep other sessions' turns queued.
        self._settling: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._catch_up_task: asyncio.Task[None] | None = None
        # (turn, epoch) this worker started and that may still be RUNNING under
        # it: a claim whose answer was lost is told apart from these.
        self._started: set[tuple[uuid.UUID, int]] = set()
        self._claim_unknown = False
        # When a sweep whose answer was lost was sent (this loop's clock).
        self._sweep_unknown_since: float | None = None
        self._running: dict[uuid.UUID, _Running] = {}
        # Every running turn's lease is renewed by one statement per tick, and
        # the turns that end together are finished by one.
        self._renewer: asyncio.Task[None] | None = None
        self.finisher = Finisher(engine)
        self._cancel_checks: set[asyncio.Task[None]] = set()
        # Turns whose cancel is to be read, by the one reader task.
        self._cancel_wanted: dict[uuid.UUID, _Running] = {}
        self._cancel_reader: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self.claimed = 0
        self.interrupted = 0

    @property
    def running_count(self) -> int:
        return len(self._running)

    def wake(self) -> None:
        self._wake.set()

    # -- cancels -----------------------------------------------------------
    def cancel_requested(self, turn_id: uuid.UUID) -> None:
        """This process recorded the cancel of ``turn_id``: if it runs here,
        its next safe point stops it."""
        running = self._running.get(turn_id)
        if running is not None:
            running.cancel.request(None)

    def news(self, session_id: uuid.UUID) -> None:
        """Another process committed events of ``session_id`` (a NOTIFY):
        a turn of it running here reads whether its cancel was asked for.
        The lease renewal asks too, should the wake-up be missed."""
        for running in self._running.values():
            if running.turn.session_id == session_id:
                self._check_cancel(running)

    def _check_cancel(self, running: _Running) -> None:
        if running.cancel.requested or running.checking_cancel:
            return
        running.checking_cancel = True
        self._cancel_wanted[running.turn.id] = running
        if self._cancel_reader is None or self._cancel_reader.done():
            task = asyncio.create_task(self._read_cancels(), name="keyturn-cancel-check")
            self._cancel_reader = task
            self._cancel_checks.add(task)
            task.add_done_callback(self._cancel_checks.discard)

    async def _read_cancels(self) -> None:
        """One read for every turn whose cancel is asked about meanwhile: a
        busy session's news comes with every commit another process makes."""
        try:
            while self._cancel_wanted:
                wanted, self._cancel_wanted = self._cancel_wanted, {}
                try:
                    async with connect(self.engine) as conn:
                        found = await cancels.requested_of(conn, turn_ids=list(wanted))
                except DatabaseUnavailable:
                    return  # the next renewal asks again
                finally:
                    for running in wanted.values():
                        running.checking_cancel = False
                for turn_id, requested in found.items():
                    wanted[turn_id].cancel.request(requested.reason)
        finally:
            # Left unread (the database went, or this task was cancelled): a
            # later wake-up or renewal asks again.
            for running in self._cancel_wanted.values():
                running.checking_cancel = False
            self._cancel_wanted.clear()

    def drain(self) -> None:
        """Claim nothing more; turns already running go on."""
        self._stopping = True
        self._wake.set()

    async def stop(self) -> None:
        """Let running turns finish within the grace period; hand the rest back
        to the queue for another process. The claim loop is stopped first, by
        its supervisor."""
        self._stopping = True
        self._wake.set()
        settling = [*self._settling.values()]
        if self._catch_up_task is not None:
            settling.append(self._catch_up_task)
        for task in settling:
            task.cancel()
        if settling:
            await asyncio.wait(settling, timeout=10)
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if tasks:
            log.info(
                "waiting up to %.1fs for %d running turn(s)",
                self.settings.shutdown_grace_s,
                len(tasks),
            )
            _done, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=10)
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
            self._renewer = None

    # -- the loop --------------------------------------------------------
    async def run(self) -> None:
        """The claim loop (supervised): sweep expired leases, claim what is
        free, sleep until woken or the poll interval passes."""
        loop = asyncio.get_running_loop()
        next_sweep = 0.0
        while not self._stopping:
            # Cleared before the claim, not after it: a turn that ends (or is
            # admitted) while the claim runs leaves the event set, so the loop
            # claims again at once instead of sleeping a whole poll interval.
            self._wake.clear()
            try:
                if loop.time() >= next_sweep:
                    next_sweep = loop.time() + self.settings.claim_poll_s
                    await self._sweep()
                await self._claim()
            except DatabaseUnavailable:
                log.warning("worker: database unavailable; retrying")
            woken = await set_within(self._wake, self.settings.claim_poll_s)
            if woken and self.settings.claim_debounce_s:
                # Admissions and ends arrive together: the ones in the next
                # few milliseconds share this claim's statement and commit,
                # where each would have sent its own (fewer commits waiting
                # on the WAL's flush, the admissions' among them).
                await asyncio.sleep(self.settings.claim_debounce_s)

    async def _sweep(self) -> None:
        if self._sweep_unknown_since is None:
            sent = self._now()
            try:
                async with connect(self.engine) as conn:
                    turns = await leases.interrupt_expired(conn, by=self.owner)
            except DatabaseUnavailable:
                # Its answer may be lost after it committed: the turns it
                # interrupted would then go unsettled and unannounced.
                self._sweep_unknown_since = sent
                turns = await self._swept_unseen()
        else:
            turns = await self._swept_unseen()
        for turn in turns:
            self.interrupted += 1
            self._started.discard((turn.id, turn.epoch))
            log.warning(
                "turn %s interrupted: lease of %s expired (epoch %s)",
                turn.id,
                turn.owner,
                turn.epoch,
            )
            self.bus.committed(turn.session_id)
        if turns:
            self._wake.set()  # the next turn of those sessions may now run
        # Ask idempotent tools what the interrupted turns' unknown calls did;
        # once at start, settle what a stopped process left unsettled. Both in
        # tasks of their own: claiming goes on while a tool is slow to answer.
        for turn in turns:
            self._settle_later(turn.id)
        if self._catch_up_task is None:
            self._catch_up_task = asyncio.create_task(self._catch_up(), name="keyturn-catch-up")

    async def _swept_unseen(self) -> list[TurnRecord]:
        """Settle a sweep whose outcome is unknown, on a fresh connection: the
        turns this owner's sweeps interrupted since it was sent (the ones
        seen before are settled again harmlessly: their calls are answered).
        Raises DatabaseUnavailable while the record cannot be read (the next
        pass tries again)."""
        since = self._sweep_unknown_since
        assert since is not None
        # The database's clock is not this one: a lease's length of margin.
        within = self._now() - since + self.settings.lease_ttl_s
        async with connect(self.engine) as conn:
            turns = await leases.interrupted_by(conn, by=self.owner, within_s=within)
        self._sweep_unknown_since = None
        if turns:
            log.warning("a sweep's answer was lost; it had interrupted %d turn(s)", len(turns))
        return turns

    def _settle_later(self, turn_id: uuid.UUID) -> None:
        if turn_id in self._settling or self._stopping:
            return
        task = asyncio.create_task(self._settle(turn_id), name=f"keyturn-settle-{turn_id}")
        self._settling[turn_id] = task
        task.add_done_callback(lambda _t: self._settling.pop(turn_id, None))

    async def _settle(self, turn_id: uuid.UUID) -> None:
        """Reconcile one interrupted turn, retrying with a growing delay until
        every question it can ask has an answer."""
        delay = _SETTLE_FIRST_DELAY_S
        while True:
            try:
                unanswered = await self.runner.reconcile(turn_id)
            except Exception:
                log.warning("turn %s: settling failed; will retry", turn_id, exc_info=True)
                unanswered = -1
            if unanswered == 0:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, _SETTLE_MAX_DELAY_S)

    async def _catch_up(self) -> None:
        delay = _SETTLE_FIRST_DELAY_S
        while True:
            try:
                turn_ids = await self.runner.unsettled()
            except Exception:
                log.warning("listing unsettled turns failed; will retry", exc_info=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _SETTLE_MAX_DELAY_S)
                continue
            for turn_id in turn_ids:
                self._settle_later(turn_id)
            return

    async def _claim(self) -> None:
        if self._claim_unknown:
            await self._adopt_lost_claims()
        while not self._stopping:
            free = self.settings.max_running - len(self._running)
            if free <= 0:
                return
            try:
                async with connect(self.engine) as conn:
                    claim = await leases.claim(
                        conn, owner=self.owner, ttl_s=self.settings.lease_ttl_s, limit=free
                    )
            except DatabaseUnavailable:
                # The claim may have committed with its answer lost: its turns
                # would be RUNNING under this owner with nobody running them.
                self._claim_unknown = True
                await self._adopt_lost_claims()
                return
            if claim.lost_race:
                log.info("claim lost a race on a session; retrying")
                continue
            turns = claim.turns
            for turn in turns:
                self._start(turn)
            if len(turns) < free:
                # Fewer than asked for: nothing else was claimable. What
                # becomes so later (an admission, a turn's end) wakes the loop.
                return

    def _start(self, turn: TurnRecord) -> None:
        self.claimed += 1
        self.bus.committed(turn.session_id)
        running = _Running(turn, lease_deadline=self._now() + self.settings.lease_ttl_s)
        self._running[turn.id] = running
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew_leases(), name="keyturn-renewer")
        self.runner.cancels[turn.id] = running.cancel
        if turn.cancel_requested_at is not None:
            # Asked while it waited, or while a claim's answer was lost.
            running.cancel.request(turn.cancel_reason)
        self._started.add((turn.id, turn.epoch))
        running.task = asyncio.create_task(self._execute(running), name=f"keyturn-turn-{turn.id}")

    async def _adopt_lost_claims(self) -> None:
        """Settle a claim whose outcome is unknown, on a fresh connection: a
        turn RUNNING under this owner that this worker never started was
        claimed by it, and is run under that epoch. Raises DatabaseUnavailable
        while the record cannot be read (the next pass tries again)."""
        async with connect(self.engine) as conn:
            owned = await leases.owned_running(conn, owner=self.owner)
        self._claim_unknown = False
        for turn in owned:
            if turn.id in self._running or (turn.id, turn.epoch) in self._started:
                continue
            log.warning(
                "turn %s: its claim's answer was lost; running it (epoch %s)", turn.id, turn.epoch
            )
            self._start(turn)

    # -- one turn --------------------------------------------------------
    async def _execute(self, running: _Running) -> None:
        turn = running.turn
        output = Output(
            record=DeltaRecorder(
                engine=self.engine,
                bus=self.bus,
                turn=turn,
                owner=self.owner,
                lease_ttl_s=self.settings.lease_ttl_s,
            ),
            flush_interval_s=self.settings.delta_flush_s,
            cancel=running.cancel,
        )
        try:
            # The reply runs in this task: a lost lease cancels it where it
            # is (_Running.lose_lease), with no task of its own to watch for that.
            running.replying = True
            try:
                try:
                    text = await self._reply(turn, output)
                finally:
                    running.replying = False
                if running.lease_lost:
                    # A cancel the reply's code kept to itself: the work is
                    # abandoned all the same (its end would be refused).
                    raise asyncio.CancelledError
            except asyncio.CancelledError:
                if not running.took_back_lease_cancel():
                    raise  # a stop past its grace: handed back below
                output.abandon()
                log.warning("turn %s: lease lost while running; abandoning the work", turn.id)
                return
            except AwaitingApproval:
                # WAITING in the record, its lease released: this process's
                # part in the turn is over until a decision requeues it.
                log.info("turn %s: waiting for a decision on a tool call", turn.id)
                running.ended = True
                return
            except CancelRequested:
                running.ended = await self._finish_cancelled(turn, running.cancel, output)
            except (StaleLease, ToolOutcomeUnknown, DatabaseUnavailable) as error:
                # The ledger or a delta was refused, a tool's effect is
                # unknown, or the database stayed away longer than the lease
                # could hold: the turn is left to its lease, to be
                # interrupted and settled.
                log.warning("turn %s: %s; leaving it to its lease", turn.id, error)
                return
            except ModelError as error:
                running.ended = await self._finish(turn, TurnStatus.FAILED, str(error), output)
            except Exception:
                log.exception("turn %s: model raised", turn.id)
                running.ended = await self._finish(
                    turn, TurnStatus.FAILED, "internal error while producing the reply", output
                )
            else:
                running.ended = await self._finish(turn, TurnStatus.COMPLETED, text, output)
        except asyncio.CancelledError:
            # Shutdown past the grace period: hand the turn back to the queue.
            output.abandon()
            running.ended = await asyncio.shield(self._release(turn))
            raise
        finally:
            output.abandon()
            if running.ended:
                self._started.discard((turn.id, turn.epoch))
            self._running.pop(turn.id, None)
            self.runner.cancels.pop(turn.id, None)
            self._wake.set()

    async def _reply(self, turn: TurnRecord, output: Output) -> str:
        past: list[PastTurn] = []
        while turn.history is History.FULL:
            # A database outage here is no reason to fail the turn: retry
            # while the lease holds (a lost lease cancels this task).
            try:
                async with connect(self.engine) as conn:
                    rows = await leases.history(
                        conn,
                        session_id=turn.session_id,
                        admit_seq=turn.admit_seq,
                        limit=self.settings.history_max_turns,
                    )
            except DatabaseUnavailable:
                log.warning("turn %s: reading its history failed; will retry", turn.id)
                await asyncio.sleep(0.2)
                continue
            past = [
                PastTurn(
                    row.input,
                    row.output,
                    row.status,
                    tuple(
                        ToolOutcome(t["index"], t["tool"], t["arguments"], t["result"])
                        for t in row.tools
                    ),
                )
                for row in rows
            ]
            break
        return await self.runner.produce(turn, past, output)

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    async def _renew_leases(self) -> None:
        """Renew the lease of every turn this process runs, in one statement
        per tick, until the worker stops. Any error is retried: a renewal
        loop that died would let healthy turns' leases run out. Past a
        turn's deadline it still tries, since the epoch decides: a renewal the
        record accepts means nobody has interrupted the turn."""
        delay = self.settings.lease_renew_s
        while True:
            await asyncio.sleep(delay)
            delay = self.settings.lease_renew_s
            held = [r for r in self._running.values() if not r.lease_lost]
            if not held:
                continue
            sent = self._now()
            try:
                async with connect(self.engine) as conn:
                    answer = await leases.renew_many(
                        conn,
                        leases=[(r.turn.id, r.turn.epoch) for r in held],
                        ttl_s=self.settings.lease_ttl_s,
                    )
            except Exception as error:
                late = sum(1 for r in held if self._now() > r.lease_deadline)
                log.warning(
                    "lease renewal of %d turn(s) failed%s (%r); will retry",
                    len(held),
                    f", {late} past their deadline" if late else "",
                    error,
                )
                # Sooner than a regular renewal, to renew before the deadline.
                delay = self.settings.lease_renew_s / 2
                continue
            for running in held:
                renewal = answer.renewed.get(running.turn.id)
                if renewal is not None:
                    running.lease_deadline = sent + self.settings.lease_ttl_s
                    if renewal.cancel_requested:
                        self._check_cancel(running)
                elif running.turn.id in answer.refused:
                    running.lose_lease()
                else:
                    # Held by another writer this moment: ask again soon.
                    delay = self.settings.lease_renew_s / 2

    async def _finish_cancelled(
        self, turn: TurnRecord, signal: CancelSignal, produced: Output
    ) -> bool:
        """CANCELLED at a safe point, with the output so far and the state of
        every tool call the record holds (a call in flight when the cancel
        arrived has finished: its result is in the record)."""
        try:
            async with connect(self.engine) as conn:
                found = await cancels.requested(conn, turn_id=turn.id)
                events = await reads.turn_events(conn, turn_id=turn.id)
        except DatabaseUnavailable:
            log.warning("turn %s: could not read it to record its cancel", turn.id)
            return False
        calls = [
            {"index": c.index, "tool": c.tool, "state": c.state, "result": c.result}
            for c in tool_calls(events)
        ]
        extra: dict[str, object] = {
            "reason": found.reason if found is not None else signal.reason,
            "idempotencyKey": found.key if found is not None else None,
            "toolCalls": calls,
            "inFlightCall": signal.arrived_during,
        }
        log.info("turn %s: cancelled at a safe point", turn.id)
        return await self._finish(turn, TurnStatus.CANCELLED, "", produced, extra)

    async def _finish(
        self,
        turn: TurnRecord,
        status: TurnStatus,
        text: str,
        produced: Output,
        extra: dict[str, object] | None = None,
    ) -> bool:
        """COMPLETED with ``text`` as the output, or FAILED with it as the error
        (keeping what the model streamed before it failed). The text not yet
        recorded as a delta is written with the end, in its statement.
        True when the record holds that end."""
        try:
            await produced.flush()
        except (StaleLease, DatabaseUnavailable) as failure:
            log.warning("turn %s: %s; leaving it to its lease", turn.id, failure)
            return False
        last = produced.unrecorded
        delta = (
            deltas.delta_data(text=last.text, index=last.index, epoch=turn.epoch)
            if last is not None
            else None
        )
        event_type = _END_EVENT[status]
        output: str | None
        error: str | None
        if status is TurnStatus.COMPLETED:
            output, error = text, None
        elif status is TurnStatus.CANCELLED:
            output, error = produced.text or None, None
        else:
            output, error = produced.text or None, text
        data: dict[str, object] = {"status": status, "epoch": turn.epoch}
        if status in (TurnStatus.COMPLETED, TurnStatus.CANCELLED):
            data["output"] = output
        if error is not None:
            data["error"] = error
        data.update(extra or {})
        request = leases.Finish(turn.id, turn.epoch, status, event_type, output, error, data, delta)
        # Retry through a database outage for as long as the lease could hold.
        deadline = asyncio.get_running_loop().time() + self.settings.lease_ttl_s
        refused = False
        while True:
            try:
                # Written together with the other turns that end meanwhile.
                if not await self.finisher.finish(request):
                    async with connect(self.engine) as conn:
                        # A refusal may be this worker's own earlier attempt,
                        # whose commit answer was lost: then the turn is finished.
                        if not await leases.finished_by(
                            conn, turn_id=turn.id, epoch=turn.epoch, owner=self.owner, status=status
                        ):
                            await leases.record_refused_write(
                                conn,
                                turn_id=turn.id,
                                epoch=turn.epoch,
                                attempted=event_type,
                                by=self.owner,
                            )
                            log.warning(
                                "turn %s: %s refused, epoch %s is stale",
                                turn.id,
                                event_type,
                                turn.epoch,
                            )
                            refused = True
                break
            except DatabaseUnavailable:
                if asyncio.get_running_loop().time() > deadline:
                    log.error(
                        "turn %s: could not record %s; its lease will expire", turn.id, event_type
                    )
                    return False
                await asyncio.sleep(0.5)
        self.bus.committed(turn.session_id)
        return not refused

    async def _release(self, turn: TurnRecord) -> bool:
        """True when the turn went back to the queue. A release whose answer
        was lost is settled by reading whether its turn.released is in the
        record; if not, it is sent again, for a few seconds at most (the
        process is stopping)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(self.settings.lease_ttl_s, _RELEASE_RETRY_S)
        sent = False
        while True:
            try:
                async with connect(self.engine) as conn:
                    if sent and await leases.released_by(
                        conn, turn_id=turn.id, epoch=turn.epoch, owner=self.owner
                    ):
                        released = True
                    else:
                        sent = True
                        released = (
                            await leases.release(
                                conn, turn_id=turn.id, epoch=turn.epoch, owner=self.owner
                            )
                            is not None
                        )
                break
            except DatabaseUnavailable:
                if loop.time() > deadline:
                    log.error(
                        "turn %s: could not hand back on shutdown; its lease will expire", turn.id
                    )
                    return False
                await asyncio.sleep(0.2)
        if not released:
            return False
        log.info("turn %s handed back to the queue", turn.id)
        self.bus.committed(turn.session_id)
        return True
