"""The event bus against a real database: bounded memory, and a subscriber that
falls behind the shared window is re-read from its own cursor."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from keyturn.db.engine import Engine, create_engine
from keyturn.runtime.bus import CACHE_EVENTS, EventBus, Subscriber


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[Engine]:
    e = create_engine(database_url, pool_size=2)
    yield e
    await e.dispose()


async def append_events(db: Any, sid: uuid.UUID, n: int) -> None:
    """Append n events the way Keyturn does: bump the counter, insert at it."""
    await db.execute(
        """
        WITH bump AS (UPDATE sessions SET event_seq = event_seq + $2 WHERE id = $1
                      RETURNING event_seq)
        INSERT INTO events (session_id, seq, type, data)
        SELECT $1, bump.event_seq - $2 + g, 'tool.planned', '{}'::jsonb
        FROM bump, generate_series(1, $2) AS g
        """,
        sid,
        n,
    )


async def drain(bus: EventBus, sub: Subscriber) -> list[int]:
    seqs: list[int] = []
    while True:
        events = await bus.read(sub)
        if not events:
            return seqs
        seqs += [e.seq for e in events]


async def test_a_lagging_subscriber_reads_from_its_cursor_and_misses_nothing(
    engine: Engine, db: Any
) -> None:
    sid = uuid.uuid4()
    await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'FULL')", sid)
    await append_events(db, sid, 300)
    bus = EventBus(engine, poll_s=60)
    fast = bus.register(sid, 0)
    slow = bus.register(sid, 0)

    first_page = [e.seq for e in await bus.read(slow)]
    assert first_page == list(range(1, 201))
    assert await drain(bus, fast) == list(range(1, 301))

    # Far more news than the shared window keeps, while the slow one waits.
    await append_events(db, sid, 3 * CACHE_EVENTS)
    bus.wake(sid)
    total = 300 + 3 * CACHE_EVENTS
    assert await drain(bus, fast) == list(range(301, total + 1))
    assert await drain(bus, slow) == list(range(201, total + 1))
    # The window never holds more than its bound, whatever the backlog.
    channel = bus._channels[sid]
    assert len(channel.cache) <= CACHE_EVENTS
    bus.unregister(fast)
    bus.unregister(slow)
    assert sid not in bus._channels


async def test_the_safety_net_poll_finds_news_no_wake_up_announced(engine: Engine, db: Any) -> None:
    sid = uuid.uuid4()
    await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'FULL')", sid)
    bus = EventBus(engine, poll_s=0.2)
    poller = asyncio.create_task(bus.poll_forever())
    try:
        sub = bus.register(sid, 0)
        assert await bus.read(sub) == []
        await append_events(db, sid, 3)  # committed, but nobody calls wake()
        async with asyncio.timeout(5):
            await bus.wait(sub)
        assert [e.seq for e in await bus.read(sub)] == [1, 2, 3]
        bus.unregister(sub)
    finally:
        poller.cancel()
        bus.stop()
