"""The runtime of one process: the composition root that builds the worker,
the bus, the listener and their supervisor, and the entry points that write
(create a session, admit a turn, resolve an interrupted one, delete a
session).

Reads for the API go through :class:`keyturn.runtime.reads.Reads`, which
holds no state of its own.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from keyturn.db import reads as db_reads
from keyturn.db.engine import WORKER_SETTINGS, Engine, asyncpg_dsn, connect, create_engine
from keyturn.db.listener import Listener
from keyturn.db.records import EventRecord, SessionRecord, TurnRecord
from keyturn.domain import History, Multitask, TurnStatus
from keyturn.errors import ShuttingDown
from keyturn.runtime import streams
from keyturn.runtime.admission import Admission, AdmissionOutcome, admit_turn
from keyturn.runtime.admitter import Admitter
from keyturn.runtime.approval import (
    ApprovalPolicy,
    DecisionOutcome,
    DecisionRequest,
    DecisionResult,
    PendingApproval,
    decide,
)
from keyturn.runtime.approval import pending as pending_approvals
from keyturn.runtime.bus import EventBus
from keyturn.runtime.cancel import CancelOutcome, CancelRequest, CancelResult, cancel_turn
from keyturn.runtime.crash import CrashHook
from keyturn.runtime.deletion import (
    DeletionOutcome,
    DeletionRequest,
    DeletionResult,
    delete_session,
)
from keyturn.runtime.model import FixtureModel, Model
from keyturn.runtime.planner import keep_statistics
from keyturn.runtime.python_tools import load_python_tools
from keyturn.runtime.reads import Reads
from keyturn.runtime.resolution import (
    ResolutionOutcome,
    ResolutionRequest,
    ResolutionResult,
    resolve,
)
from keyturn.runtime.retention import RetentionPolicy, Sweeper
from keyturn.runtime.stats import NoStats, Stats
from keyturn.runtime.supervisor import Supervisor
from keyturn.runtime.tools import ToolInfo, synthetic_tools
from keyturn.runtime.tools_file import load as load_tools_file
from keyturn.runtime.validation import TurnRequest
from keyturn.runtime.worker import Worker, WorkerSettings, new_owner_id
from keyturn.settings import Settings

if TYPE_CHECKING:
    from keyturn.runtime.mcp_tools import McpServers

log = logging.getLogger(__name__)


def build_model(settings: Settings) -> Model:
    """The model that answers turns: the offline fixture, unless
    KEYTURN_MODEL=openai names a chat-completions server."""
    if settings.model == "openai":
        # Imported only when chosen: the SDK takes a while to import.
        from keyturn.runtime.openai_model import OpenAIModel

        return OpenAIModel.from_settings(settings)
    return FixtureModel(delay_ms=settings.fixture_delay_ms)


class Runtime:
    def __init__(
        self,
        *,
        engine: Engine,
        settings: Settings,
        database_url: str,
        model: Model | None = None,
        stats: Stats | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.stats = stats or NoStats()
        self.owner = new_owner_id()
        self.reads = Reads(engine)
        self.bus = EventBus(engine, poll_s=settings.subscription_poll_s)
        self.listener = Listener(
            asyncpg_dsn(database_url), on_wake=self._news, on_reconnect=self.bus.wake_all
        )
        self.bus.broadcast = self.listener.wake
        # The synthetic tools' store has its own connections: its writes are
        # never in a transaction of the runtime's record.
        # Neither it nor the worker's pool below counts against a tenant's
        # share of connections (keyturn.db.tenancy): a turn's work never waits
        # for the requests of its tenant, even in a task begun in one.
        self.store_engine = create_engine(database_url, pool_size=2, per_tenant=False)
        # The worker's writes (claims, lease renewals, finishes, the tool
        # ledger) and the history a running turn reads have their own pool:
        # however many requests wait for a connection of theirs, a renewal
        # never queues behind them and a running turn keeps its lease.
        self.work_engine = create_engine(
            database_url,
            pool_size=settings.work_pool,
            pool_timeout=settings.pool_timeout_s,
            per_tenant=False,
            server_settings=WORKER_SETTINGS,
        )
        # New keys' turns, admitted together when they arrive together.
        self.admitter = Admitter(self.engine)
        self.model = model or build_model(settings)
        # The builtin tools now; those of Python entry points and MCP servers
        # join them at start, before any turn runs.
        self.tools = synthetic_tools(self.store_engine)
        self.tool_servers: McpServers | None = None
        tools_file = load_tools_file(settings.tools_file) if settings.tools_file else None
        self.approval = ApprovalPolicy(
            approve_unsafe=settings.approve_unsafe,
            tools=tools_file.approvals if tools_file is not None else None,
        )
        if tools_file is not None:
            # Imported only when used: the SDK takes a while to import.
            from keyturn.runtime.mcp_tools import McpServers

            self.tool_servers = McpServers(
                tools_file,
                # A call waits this long for a server that is reconnecting.
                ready_wait_s=min(10.0, settings.tool_timeout_s / 2),
            )
        self.worker = Worker(
            engine=self.work_engine,
            model=self.model,
            bus=self.bus,
            settings=WorkerSettings(
                max_running=settings.max_running_turns,
                lease_ttl_s=settings.lease_ttl_s,
                lease_renew_s=settings.lease_renew_s,
                claim_poll_s=settings.claim_poll_s,
                claim_debounce_s=settings.claim_debounce_ms / 1000,
                shutdown_grace_s=settings.shutdown_grace_s,
                max_tool_rounds=settings.max_tool_rounds,
                tool_timeout_s=settings.tool_timeout_s,
                delta_flush_s=settings.delta_flush_ms / 1000,
                history_max_turns=settings.history_max_turns,
            ),
            owner=self.owner,
            tools=self.tools,
            crash=CrashHook.from_settings(settings),
            approval=self.approval,
        )
        self.supervisor = Supervisor()
        self.supervisor.add("worker", self.worker.run)
        self.supervisor.add("bus-poll", self.bus.poll_forever)
        self.supervisor.add("listener", self.listener.supervise)
        self.supervisor.add("notifier", self.listener.send_forever)
        # A young table gets statistics as it grows, not on autovacuum's next
        # round (keyturn.db.planner).
        self.supervisor.add("statistics", lambda: keep_statistics(self.work_engine))
        # The sweeper runs only when something may be pruned; every process
        # runs it, and their batches skip each other's sessions.
        self.sweeper = Sweeper(
            engine=self.engine,
            policy=RetentionPolicy.of(settings),
            batch=settings.retention_batch,
            batch_events=settings.retention_batch_events,
            interval_s=settings.retention_sweep_s,
            stats=self.stats,
            crash=CrashHook.from_settings(settings),
        )
        if self.sweeper.policy.prunes:
            self.supervisor.add("retention", self.sweeper.run_forever)
        self.accepting = False

    def _news(self, session_id: uuid.UUID) -> None:
        """Another process committed events of ``session_id``: subscribers
        read them, and a turn of it running here learns of its cancel."""
        self.bus.wake(session_id)
        self.worker.news(session_id)

    def supervise(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run another long-lived task of this process under the same watch."""
        self.supervisor.add(name, run)

    async def start(self) -> None:
        # A tool that cannot be set up stops the start here, never mid-turn.
        for source, tools in load_python_tools():
            self.tools.add(tools, source=source)
        if self.tool_servers is not None:
            for source, tools in await self.tool_servers.start():
                try:
                    self.tools.add(tools, source=source)
                except Exception:
                    await self.tool_servers.stop()
                    raise
        await self.listener.start()
        self.supervisor.start()
        self.accepting = True
        log.info("runtime started as %s", self.owner)

    def drain(self) -> None:
        """The process was asked to stop: admit nothing and claim nothing more,
        so that other processes take the queue, while running turns finish."""
        if self.accepting:
            log.info("draining: no new admissions or claims; running turns go on")
        self.accepting = False
        self.worker.drain()

    async def stop(self) -> None:
        self.accepting = False
        # The claim loop first; running turns then finish (their last events
        # still wake other processes through the notifier), then the rest.
        await self.supervisor.stop("worker")
        await self.worker.stop()
        if self.tool_servers is not None:
            await self.tool_servers.stop()
        await self.supervisor.stop()
        self.bus.stop()
        await self.listener.stop()
        await self.store_engine.dispose()
        await self.work_engine.dispose()
        # A model with connections of its own (the OpenAI client's) closes them.
        close = getattr(self.model, "close", None)
        if close is not None:
            await close()

    def tool_infos(self) -> list[ToolInfo]:
        """The tools this process offers the model."""
        return self.tools.infos()

    # -- writes ------------------------------------------------------------
    # Every method a client reaches names the caller's tenant; sessions, turns
    # and events of another tenant are simply not found.
    async def create_session(
        self, *, tenant: str, default_history: History, multitask: Multitask = Multitask.ENQUEUE
    ) -> SessionRecord:
        async with connect(self.engine) as conn:
            return await db_reads.create_session(
                conn, tenant=tenant, default_history=default_history, multitask=multitask
            )

    async def submit(self, request: TurnRequest, *, tenant: str) -> Admission:
        if not self.accepting:
            raise ShuttingDown()
        admission = await admit_turn(
            engine=self.engine,
            request=request,
            tenant=tenant,
            stats=self.stats,
            log_inputs=self.settings.log_inputs,
            key_retention_s=self.settings.key_retention,
            admitter=self.admitter,
        )
        if admission.outcome is AdmissionOutcome.ACCEPTED:
            self.bus.committed(request.session_id)
            if admission.cancelled:
                self._cancelled(list(admission.cancelled))
            self.worker.wake()
        return admission

    async def resolve_interrupted(
        self, request: ResolutionRequest, *, tenant: str
    ) -> ResolutionResult:
        if not self.accepting:
            raise ShuttingDown()
        result = await resolve(engine=self.engine, request=request, tenant=tenant)
        if result.outcome is ResolutionOutcome.ACCEPTED and result.turn is not None:
            self.bus.committed(result.turn.session_id)
            self.worker.wake()
        return result

    async def decide_tool_call(self, request: DecisionRequest, *, tenant: str) -> DecisionResult:
        if not self.accepting:
            raise ShuttingDown()
        result = await decide(engine=self.engine, request=request, tenant=tenant)
        if result.outcome is DecisionOutcome.ACCEPTED and result.turn is not None:
            self.bus.committed(result.turn.session_id)
            self.worker.wake()
        return result

    async def pending_approvals(
        self, *, tenant: str, after: int, limit: int
    ) -> tuple[list[PendingApproval], bool]:
        return await pending_approvals(engine=self.engine, tenant=tenant, after=after, limit=limit)

    async def cancel_turn(self, request: CancelRequest, *, tenant: str) -> CancelResult:
        if not self.accepting:
            raise ShuttingDown()
        result = await cancel_turn(engine=self.engine, request=request, tenant=tenant)
        if result.outcome is CancelOutcome.CANCELLED and result.turn is not None:
            self._cancelled([result.turn])
        elif result.turn is not None and result.turn.status is TurnStatus.CANCELLED:
            # Perhaps ended just now (a turn that went on to wait after its
            # cancel was asked for): its session's next turn may run.
            self.bus.committed(result.turn.session_id)
            self.worker.wake()
        return result

    def _cancelled(self, turns: list[TurnRecord]) -> None:
        """Cancels were recorded: wake every process (the one running a turn
        stops it), this one's worker (a queued turn's successor may run now)."""
        for turn in turns:
            self.bus.committed(turn.session_id)
            self.worker.cancel_requested(turn.id)
        self.worker.wake()

    async def delete_session(self, request: DeletionRequest, *, tenant: str) -> DeletionResult:
        if not self.accepting:
            raise ShuttingDown()
        # A running turn is cancelled first, and its process told as for a
        # cancelTurn; the deletion waits for it at most delete_wait_s.
        result = await delete_session(
            engine=self.engine,
            request=request,
            tenant=tenant,
            wait_s=self.settings.delete_wait_s,
            on_cancelled=self._cancelled,
        )
        if result.outcome is DeletionOutcome.DELETED:
            # Its subscribers, here and in other processes, wake, find the
            # session gone and are closed (keyturn.runtime.bus).
            self.bus.committed(request.session_id)
        return result

    # -- streams -----------------------------------------------------------
    def session_events(
        self, session_id: uuid.UUID, after_seq: int, *, tenant: str
    ) -> AsyncIterator[EventRecord]:
        return streams.session_events(
            engine=self.engine,
            bus=self.bus,
            tenant=tenant,
            session_id=session_id,
            after_seq=after_seq,
        )

    def turn_events(
        self, turn_id: uuid.UUID, after_seq: int, *, tenant: str
    ) -> AsyncIterator[EventRecord]:
        return streams.turn_events(
            engine=self.engine, bus=self.bus, tenant=tenant, turn_id=turn_id, after_seq=after_seq
        )

    def turn_completed(self, turn_id: uuid.UUID, *, tenant: str) -> AsyncIterator[TurnRecord]:
        return streams.turn_completed(
            engine=self.engine, bus=self.bus, tenant=tenant, turn_id=turn_id
        )
