"""Live streams over the bus: a session's events, and one turn's end.

Both register with the bus *before* their first read (see
:mod:`keyturn.runtime.bus`), so an event that commits in between is not missed.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from keyturn.db import reads
from keyturn.db.engine import Engine, connect
from keyturn.db.records import EventRecord, TurnRecord
from keyturn.domain import TERMINAL_EVENTS, TERMINAL_STATUSES
from keyturn.errors import NotFound
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


async def turn_completed(
    *, engine: Engine, bus: EventBus, tenant: str, turn_id: uuid.UUID
) -> AsyncIterator[TurnRecord]:
    async with connect(engine) as conn:
        first = await reads.turn(conn, tenant=tenant, turn_id=turn_id)
    if first is None:
        raise NotFound(f"turn {turn_id} not found")
    if first.status in TERMINAL_STATUSES:
        yield first
        return
    sub = bus.register(first.session_id, 0)
    try:
        # Read again after registering, in one snapshot with the session's
        # counter: if the turn has not ended there, its end carries a higher seq.
        async with connect(engine) as conn:
            found = await reads.turn_with_session_seq(conn, tenant=tenant, turn_id=turn_id)
        assert found is not None  # turns are never deleted
        turn, seq = found
        if turn.status in TERMINAL_STATUSES:
            yield turn
            return
        sub.cursor = seq
        while True:
            events = await bus.read(sub)
            if any(e.turn_id == turn_id and e.type in TERMINAL_EVENTS for e in events):

                async def read_ended() -> TurnRecord | None:
                    async with connect(engine) as conn:
                        return await reads.turn(conn, tenant=tenant, turn_id=turn_id)

                # Every listener of this turn wakes now: one query serves them all.
                ended = await bus.shared.get(("ended", tenant, turn_id), read_ended)
                assert ended is not None
                yield ended
                return
            if not events:
                await bus.wait(sub)
    finally:
        bus.unregister(sub)
