"""Running turns: claim from the queue, hold a lease, call the model, record the end.

Any process may run any queued turn. A claim is one short statement that sets
the owner, a lease on the database clock and a new epoch; no row stays locked
while the model works. The owner renews the lease; every later write names
the epoch, so a worker whose lease passed on has its writes refused (and the
refusal recorded). A lease that runs out marks its turn INTERRUPTED: Keyturn
never runs a turn a second time on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field

from keyturn.db import leases
from keyturn.db.engine import Engine, connect
from keyturn.db.records import TurnRecord
from keyturn.domain import EventType, History, TurnStatus
from keyturn.errors import DatabaseUnavailable, ModelError, StaleLease, ToolOutcomeUnknown
from keyturn.runtime.bus import EventBus
from keyturn.runtime.crash import CrashHook
from keyturn.runtime.model import Model, PastTurn
from keyturn.runtime.tool_runner import ToolRunner
from keyturn.runtime.tools import Tools

log = logging.getLogger(__name__)


_END_EVENT = {
    TurnStatus.COMPLETED: EventType.TURN_COMPLETED,
    TurnStatus.FAILED: EventType.TURN_FAILED,
}


def new_owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class _Running:
    turn: TurnRecord
    task: asyncio.Task[None] | None = None
    lease_lost: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class WorkerSettings:
    max_running: int
    lease_ttl_s: float
    lease_renew_s: float
    claim_poll_s: float
    shutdown_grace_s: float


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
        )
        self._settled_once = False
        self._running: dict[uuid.UUID, _Running] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self.claimed = 0
        self.interrupted = 0

    @property
    def running_count(self) -> int:
        return len(self._running)

    def wake(self) -> None:
        self._wake.set()

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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.claim_poll_s)

    async def _sweep(self) -> None:
        async with connect(self.engine) as conn:
            turns = await leases.interrupt_expired(conn, by=self.owner)
        for turn in turns:
            self.interrupted += 1
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
        # once at start, settle what a stopped process left unsettled.
        for turn in turns:
            await self.runner.reconcile(turn.id)
        if not self._settled_once:
            await self.runner.catch_up()
            self._settled_once = True

    async def _claim(self) -> None:
        while not self._stopping:
            free = self.settings.max_running - len(self._running)
            if free <= 0:
                return
            async with connect(self.engine) as conn:
                claim = await leases.claim(
                    conn, owner=self.owner, ttl_s=self.settings.lease_ttl_s, limit=free
                )
            if claim.lost_race:
                log.info("claim lost a race on a session; retrying")
                continue
            turns = claim.turns
            if not turns:
                return
            for turn in turns:
                self.claimed += 1
                self.bus.committed(turn.session_id)
                running = _Running(turn)
                self._running[turn.id] = running
                running.task = asyncio.create_task(
                    self._execute(running), name=f"keyturn-turn-{turn.id}"
                )

    # -- one turn --------------------------------------------------------
    async def _execute(self, running: _Running) -> None:
        turn = running.turn
        renewer = asyncio.create_task(self._renew(running))
        try:
            model_task = asyncio.create_task(self._reply(turn))
            lost = asyncio.create_task(running.lease_lost.wait())
            try:
                await asyncio.wait({model_task, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
            if not model_task.done():
                model_task.cancel()
                log.warning("turn %s: lease lost while running; abandoning the work", turn.id)
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await model_task
                return
            try:
                output = model_task.result()
            except (StaleLease, ToolOutcomeUnknown) as error:
                # The ledger refused a write, or a tool's effect is unknown:
                # the turn is left to its lease, to be interrupted and settled.
                log.warning("turn %s: %s; leaving it to its lease", turn.id, error)
                return
            except ModelError as error:
                await self._finish(turn, TurnStatus.FAILED, str(error))
            except Exception:
                log.exception("turn %s: model raised", turn.id)
                await self._finish(
                    turn, TurnStatus.FAILED, "internal error while producing the reply"
                )
            else:
                await self._finish(turn, TurnStatus.COMPLETED, output)
        except asyncio.CancelledError:
            # Shutdown past the grace period: hand the turn back to the queue.
            await asyncio.shield(self._release(turn))
            raise
        finally:
            renewer.cancel()
            self._running.pop(turn.id, None)
            self._wake.set()

    async def _reply(self, turn: TurnRecord) -> str:
        past: list[PastTurn] = []
        while turn.history is History.FULL:
            # A database outage here is no reason to fail the turn: retry
            # while the lease holds (a lost lease cancels this task).
            try:
                async with connect(self.engine) as conn:
                    rows = await leases.history(
                        conn, session_id=turn.session_id, admit_seq=turn.admit_seq
                    )
            except DatabaseUnavailable:
                log.warning("turn %s: reading its history failed; will retry", turn.id)
                await asyncio.sleep(0.2)
                continue
            past = [PastTurn(i, o, s) for i, o, s in rows]
            break
        return await self.runner.produce(turn, past)

    async def _renew(self, running: _Running) -> None:
        turn = running.turn
        while True:
            await asyncio.sleep(self.settings.lease_renew_s)
            try:
                async with connect(self.engine) as conn:
                    ok = await leases.renew(
                        conn, turn_id=turn.id, epoch=turn.epoch, ttl_s=self.settings.lease_ttl_s
                    )
            except DatabaseUnavailable:
                log.warning("turn %s: lease renewal failed; will retry", turn.id)
                continue
            if not ok:
                running.lease_lost.set()
                return

    async def _finish(self, turn: TurnRecord, status: TurnStatus, text: str) -> None:
        """COMPLETED with ``text`` as the output, or FAILED with it as the error."""
        event_type = _END_EVENT[status]
        output, error = (text, None) if status is TurnStatus.COMPLETED else (None, text)
        data: dict[str, object] = {"status": status, "epoch": turn.epoch}
        if output is not None:
            data["output"] = output
        if error is not None:
            data["error"] = error
        # Retry through a database outage for as long as the lease could hold.
        deadline = asyncio.get_running_loop().time() + self.settings.lease_ttl_s
        while True:
            try:
                async with connect(self.engine) as conn:
                    done = await leases.finish(
                        conn,
                        turn_id=turn.id,
                        epoch=turn.epoch,
                        status=status,
                        event_type=event_type,
                        output=output,
                        error=error,
                        data=data,
                    )
                    if done is None:
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
                break
            except DatabaseUnavailable:
                if asyncio.get_running_loop().time() > deadline:
                    log.error(
                        "turn %s: could not record %s; its lease will expire", turn.id, event_type
                    )
                    return
                await asyncio.sleep(0.5)
        self.bus.committed(turn.session_id)

    async def _release(self, turn: TurnRecord) -> None:
        try:
            async with connect(self.engine) as conn:
                released = await leases.release(
                    conn, turn_id=turn.id, epoch=turn.epoch, owner=self.owner
                )
        except DatabaseUnavailable:
            log.error("turn %s: could not hand back on shutdown; its lease will expire", turn.id)
            return
        if released is not None:
            log.info("turn %s handed back to the queue", turn.id)
            self.bus.committed(turn.session_id)
