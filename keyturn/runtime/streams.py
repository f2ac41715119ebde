"""Live streams over the bus: a session's events, one turn's events, and one
turn's end.

All register with the bus *before* their first read (see
:mod:`keyturn.runtime.bus`), so an event that commits in between is not missed.
A session deleted while they stream ends them with SessionDeleted (NOT_FOUND).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from keyturn.db import reads
from keyturn.db.engine import Engine, connect
from keyturn.db.records import EventRecord, TurnRecord
from keyturn.domain import TERMINAL_EVENTS, TERMINAL_STATUSES
from keyturn.errors import NotFound, SessionDeleted
from keyturn.runtime.bus import EventBus


async def session_events(
    *, engine: Engine, bus: EventBus, tenant: str, session_id: uuid.UUID, after_seq: int
) -> AsyncIterator[EventRecord]:
    sub = bus.register(session_id, after_seq)
    try:
        async with connect(engine) as conn:
            if await reads.session(conn, tenant=tenant, session_id=session_id) is None:
                raise NotFound(f"session {session_id} not found")
        while True:
            events = await bus.read(sub)
            for event in events:
                yield event
            if not events:
                await bus.wait(sub)
    finally:
        bus.unregister(sub)


async def _turn(engine: Engine, tenant: str, turn_id: uuid.UUID) -> TurnRecord | None:
    async with connect(engine) as conn:
        return await reads.turn(conn, tenant=tenant, turn_id=turn_id)


async def _turn_and_seq(
    engine: Engine, tenant: str, turn_id: uuid.UUID
) -> tuple[TurnRecord, int] | None:
    async with connect(engine) as conn:
        return await reads.turn_with_session_seq(conn, tenant=tenant, turn_id=turn_id)


async def turn_completed(
    *, engine: Engine, bus: EventBus, tenant: str, turn_id: uuid.UUID
) -> AsyncIterator[TurnRecord]:
    # One read, in one snapshot with the session's counter: if the turn has
    # not ended there, its end carries a higher seq, and the bus hands this
    # subscriber every event after that seq, whenever it registers (from its
    # shared window or the table). So the read may be one another listener
    # of the same turn made a moment ago: a thousand listeners subscribing
    # to a running turn at once are one query, not two thousand.
    found = await bus.shared.get(
        ("turn+seq", tenant, turn_id), lambda: _turn_and_seq(engine, tenant, turn_id)
    )
    if found is None:
        raise NotFound(f"turn {turn_id} not found")
    if found[0].status in TERMINAL_STATUSES:
        yield found[0]
        return
    # The reads are helpers, and what they return is dropped once used: this
    # frame lives as long as its subscriber waits, and so would every local
    # in it (a connection's objects, two turns).
    session_id, cursor = found[0].session_id, found[1]
    del found
    sub = bus.register(session_id, cursor)
    try:
        while True:
            events = await bus.read(sub)
            if any(e.turn_id == turn_id and e.type in TERMINAL_EVENTS for e in events):
                # Every listener of this turn wakes now: one query serves them all.
                ended = await bus.shared.get(
                    ("ended", tenant, turn_id), lambda: _turn(engine, tenant, turn_id)
                )
                if ended is None:  # deleted with its session just after it ended
                    raise SessionDeleted(session_id)
                yield ended
                return
            if not events:
                await bus.wait(sub)
    finally:
        bus.unregister(sub)


async def turn_events(
    *, engine: Engine, bus: EventBus, tenant: str, turn_id: uuid.UUID, after_seq: int
) -> AsyncIterator[EventRecord]:
    """The turn's events with seq > ``after_seq``, from the record, then live,
    ending with its terminal event (at once when that is at or before
    ``after_seq``). Events the record gains after the end (a refused late
    write, a reconciliation) are not part of this stream."""
    async with connect(engine) as conn:
        first = await reads.turn(conn, tenant=tenant, turn_id=turn_id)
    if first is None:
        raise NotFound(f"turn {turn_id} not found")
    # Nothing of the turn comes before its turn.started, whose seq is admit_seq.
    sub = bus.register(first.session_id, max(after_seq, first.admit_seq - 1))
    try:
        # Read after registering: an end committed before this read is in it;
        # one committed after wakes the subscriber.
        async with connect(engine) as conn:
            recorded = await reads.turn_events(conn, turn_id=turn_id)
        ends = [e.seq for e in recorded if e.type in TERMINAL_EVENTS]
        if ends:
            for event in recorded:
                if after_seq < event.seq <= ends[0]:
                    yield event
            return
        while True:
            events = await bus.read(sub)
            for event in events:
                if event.turn_id != turn_id:
                    continue
                yield event
                if event.type in TERMINAL_EVENTS:
                    return
            if not events:
                await bus.wait(sub)
    finally:
        bus.unregister(sub)
