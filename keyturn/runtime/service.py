"""The runtime: one object per process that ties admission, the worker, the
bus and the listener together, and the reads the API needs."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from keyturn.db import reads
from keyturn.db.engine import asyncpg_dsn, connect, create_engine
from keyturn.db.listener import Listener
from keyturn.db.rows import EventRecord
from keyturn.db.tables import Session, Turn
from keyturn.errors import ShuttingDown
from keyturn.runtime import watch
from keyturn.runtime.admission import Admission, Outcome, admit_turn
from keyturn.runtime.bus import EventBus
from keyturn.runtime.crash import CrashHook
from keyturn.runtime.ledger import ToolCallView, tool_calls
from keyturn.runtime.model import FixtureModel, Model
from keyturn.runtime.requests import History, TurnRequest
from keyturn.runtime.resolution import Outcome as ResolutionOutcome
from keyturn.runtime.resolution import ResolutionRequest, ResolutionResult, resolve
from keyturn.runtime.tools import synthetic_tools
from keyturn.runtime.worker import Worker, WorkerSettings, new_owner_id
from keyturn.settings import Settings

log = logging.getLogger("keyturn.runtime")


class Runtime:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        settings: Settings,
        database_url: str,
        model: Model | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.owner = new_owner_id()
        self.bus = EventBus(engine, poll_s=settings.subscription_poll_s)
        self.listener = Listener(
            asyncpg_dsn(database_url), on_wake=self.bus.wake, on_reconnect=self.bus.wake_all
        )
        self.bus.broadcast = self.listener.wake
        # The synthetic tools' store has its own connections: its writes are
        # never in a transaction of the runtime's record.
        self.store_engine = create_engine(database_url, pool_size=2)
        self.worker = Worker(
            engine=engine,
            model=model or FixtureModel(delay_ms=settings.fixture_delay_ms),
            bus=self.bus,
            settings=WorkerSettings(
                max_running=settings.max_running_turns,
                lease_ttl_s=settings.lease_ttl_s,
                lease_renew_s=settings.lease_renew_s,
                claim_poll_s=settings.claim_poll_s,
                shutdown_grace_s=settings.shutdown_grace_s,
            ),
            owner=self.owner,
            tools=synthetic_tools(self.store_engine),
            crash=CrashHook(settings.crash_at, after=settings.crash_after),
        )
        self.accepting = False

    async def start(self) -> None:
        await self.listener.start()
        self.bus.start()
        self.worker.start()
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
        await self.worker.stop()
        await self.bus.stop()
        await self.listener.stop()
        await self.store_engine.dispose()

    # -- writes ------------------------------------------------------------
    # Every method a client reaches names the caller's tenant; sessions, turns
    # and events of another tenant are simply not found.
    async def create_session(self, *, tenant: str, default_history: History) -> Session:
        async with connect(self.engine) as conn:
            return await reads.create_session(
                conn, tenant=tenant, default_history=default_history.value
            )

    async def submit(self, request: TurnRequest, *, tenant: str) -> Admission:
        if not self.accepting:
            raise ShuttingDown()
        admission = await admit_turn(engine=self.engine, request=request, tenant=tenant)
        if admission.outcome is Outcome.ACCEPTED:
            self.bus.committed(request.session_id)
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

    # -- reads -------------------------------------------------------------
    async def session(self, session_id: uuid.UUID, *, tenant: str) -> Session | None:
        async with connect(self.engine) as conn:
            return await reads.session(conn, tenant=tenant, session_id=session_id)

    async def sessions(
        self, *, tenant: str, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> tuple[list[Session], int]:
        async with connect(self.engine) as conn:
            page = await reads.sessions_after(conn, tenant=tenant, after=after, limit=limit)
            return page, await reads.session_count(conn, tenant=tenant)

    async def turn(self, turn_id: uuid.UUID, *, tenant: str) -> Turn | None:
        async with connect(self.engine) as conn:
            return await reads.turn(conn, tenant=tenant, turn_id=turn_id)

    async def turns(
        self, *, session_id: uuid.UUID, after: int, limit: int
    ) -> tuple[list[Turn], int]:
        async with connect(self.engine) as conn:
            page = await reads.turns_after(conn, session_id=session_id, after=after, limit=limit)
            return page, await reads.turn_count(conn, session_id=session_id)

    async def events(self, *, session_id: uuid.UUID, after: int, limit: int) -> list[EventRecord]:
        async with connect(self.engine) as conn:
            return await reads.events_after(conn, session_id=session_id, after=after, limit=limit)

    async def turn_events(self, turn_id: uuid.UUID) -> list[EventRecord]:
        async with connect(self.engine) as conn:
            return await reads.turn_events(conn, turn_id=turn_id)

    async def tool_calls(self, turn_id: uuid.UUID) -> list[ToolCallView]:
        """What the tool ledger establishes about the turn's calls (the turn
        was looked up under the caller's tenant)."""
        return tool_calls(await self.turn_events(turn_id))

    # -- streams -----------------------------------------------------------
    def session_events(
        self, session_id: uuid.UUID, after_seq: int, *, tenant: str
    ) -> AsyncIterator[EventRecord]:
        return watch.session_events(
            engine=self.engine,
            bus=self.bus,
            tenant=tenant,
            session_id=session_id,
            after_seq=after_seq,
        )

    def turn_completed(self, turn_id: uuid.UUID, *, tenant: str) -> AsyncIterator[Turn]:
        return watch.turn_completed(
            engine=self.engine, bus=self.bus, tenant=tenant, turn_id=turn_id
        )
