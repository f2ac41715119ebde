"""The event bus's shared window, without a database: the table is a list in
memory and every read of it is counted, so each test can say exactly which
events a subscriber received and how many times the table was read for them.

A window holds the events ``covered_from < seq <= high`` (at most CACHE_EVENTS
of them); a subscriber inside it is served from memory, one behind it reads
the table from its own cursor.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from keyturn.db import reads as db_reads
from keyturn.db.records import EventRecord
from keyturn.runtime import bus as bus_module
from keyturn.runtime.bus import CACHE_EVENTS, PAGE, EventBus, Subscriber, _Channel

SESSION = uuid.UUID("00000000-0000-4000-8000-00000000000a")
NOW = datetime(2026, 1, 2, tzinfo=UTC)


@dataclass
class Table:
    """The session's events as the table holds them, and every read of it."""

    events: list[EventRecord] = field(default_factory=list)
    reads: list[tuple[int, int]] = field(default_factory=list)  # (after, limit) per read
    # When set, a read takes its snapshot, then waits here (a read in flight).
    hold: asyncio.Event | None = None
    holding: asyncio.Event = field(default_factory=asyncio.Event)

    def append(self, count: int) -> None:
        for _ in range(count):
            seq = len(self.events) + 1
            self.events.append(EventRecord(seq, SESSION, None, seq, "tool.planned", {}, NOW))

    async def events_after(
        self, conn: Any, *, session_id: uuid.UUID, after: int, limit: int
    ) -> list[EventRecord]:
        assert session_id == SESSION
        self.reads.append((after, limit))
        found = [e for e in self.events if e.seq > after][:limit]
        if self.hold is not None:
            self.holding.set()
            await self.hold.wait()
        await asyncio.sleep(0)  # a real read yields to the loop
        return found

    async def session_seqs(
        self, conn: Any, *, session_ids: list[uuid.UUID]
    ) -> dict[uuid.UUID, int]:
        # The session exists (a refresh that finds no news asks).
        return {SESSION: len(self.events)} if SESSION in session_ids else {}


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Table:
    table = Table()

    @contextlib.asynccontextmanager
    async def connect(engine: Any) -> AsyncIterator[object]:
        yield object()

    monkeypatch.setattr(bus_module, "connect", connect)
    monkeypatch.setattr(db_reads, "events_after", table.events_after)
    monkeypatch.setattr(db_reads, "session_seqs", table.session_seqs)
    return table


@pytest.fixture
def bus(table: Table) -> EventBus:
    return EventBus(cast(Any, None), poll_s=60)


def seqs(events: list[EventRecord]) -> list[int]:
    return [e.seq for e in events]


def upto(last: int, *, after: int = 0) -> list[int]:
    return list(range(after + 1, last + 1))


async def drain(bus: EventBus, sub: Subscriber) -> list[int]:
    """Read as a stream does: again after every non-empty read, until one is empty."""
    delivered: list[int] = []
    while events := await bus.read(sub):
        delivered += seqs(events)
    return delivered


def channel(bus: EventBus) -> _Channel:
    return bus._channels[SESSION]


def commit(bus: EventBus, table: Table, count: int) -> None:
    """``count`` events commit, and the wake-up for them arrives."""
    table.append(count)
    bus.wake(SESSION)


# -- served from the window ------------------------------------------------------


async def test_a_subscriber_inside_the_window_is_served_from_memory_without_a_read(
    bus: EventBus, table: Table
) -> None:
    first = bus.register(SESSION, 0)
    commit(bus, table, 10)
    assert await drain(bus, first) == upto(10)
    assert len(table.reads) == 1
    assert (channel(bus).covered_from, channel(bus).high) == (0, 10)

    joined = bus.register(SESSION, 4)
    assert await drain(bus, joined) == upto(10, after=4)
    assert len(table.reads) == 1  # the window had them all
    assert joined.cursor == 10


async def test_news_is_read_once_from_the_windows_high_not_from_a_subscriber(
    bus: EventBus, table: Table
) -> None:
    sub = bus.register(SESSION, 0)
    commit(bus, table, 3)
    assert await drain(bus, sub) == [1, 2, 3]

    commit(bus, table, 2)
    assert await drain(bus, sub) == [4, 5]
    assert table.reads == [(0, CACHE_EVENTS), (3, CACHE_EVENTS)]
    assert seqs(list(channel(bus).cache)) == upto(5)


async def test_without_news_a_read_answers_nothing_and_reads_nothing(
    bus: EventBus, table: Table
) -> None:
    sub = bus.register(SESSION, 0)
    commit(bus, table, 2)
    assert await drain(bus, sub) == [1, 2]
    reads_so_far = len(table.reads)

    table.append(1)  # committed, but its wake-up has not arrived
    assert await bus.read(sub) == []
    assert len(table.reads) == reads_so_far

    bus.wake(SESSION)
    assert sub.woken
    assert seqs(await bus.read(sub)) == [3]


# -- the window slides -----------------------------------------------------------


async def test_the_window_slides_past_cache_events_and_covered_from_follows_it(
    bus: EventBus, table: Table
) -> None:
    sub = bus.register(SESSION, 0)
    commit(bus, table, CACHE_EVENTS)
    assert await drain(bus, sub) == upto(CACHE_EVENTS)
    assert channel(bus).covered_from == 0  # full, nothing dropped yet

    commit(bus, table, 100)
    assert await drain(bus, sub) == upto(CACHE_EVENTS + 100, after=CACHE_EVENTS)

    window = channel(bus)
    assert len(window.cache) == CACHE_EVENTS
    assert window.cache[0].seq == 101
    assert window.covered_from == 100
    assert window.high == CACHE_EVENTS + 100
    assert seqs(list(window.cache)) == upto(CACHE_EVENTS + 100, after=100)


async def test_more_than_cache_events_at_once_are_read_in_windows_without_a_gap(
    bus: EventBus, table: Table
) -> None:
    total = 2 * CACHE_EVENTS + 50
    sub = bus.register(SESSION, 0)
    commit(bus, table, total)

    assert await drain(bus, sub) == upto(total)
    # The window is read forward from its high; the subscriber, once it fell
    # behind the window, from its own cursor.
    refreshes = [after for after, limit in table.reads if limit == CACHE_EVENTS]
    assert refreshes == [0, CACHE_EVENTS, 2 * CACHE_EVENTS]
    assert channel(bus).high == total
    assert channel(bus).covered_from == total - CACHE_EVENTS


# -- behind the window -----------------------------------------------------------


async def test_a_subscriber_behind_the_window_reads_the_table_from_its_own_cursor(
    bus: EventBus, table: Table
) -> None:
    live = bus.register(SESSION, 0)
    commit(bus, table, CACHE_EVENTS + 100)
    await drain(bus, live)
    assert channel(bus).covered_from == 100
    reads_before = len(table.reads)

    late = bus.register(SESSION, 50)  # its cursor fell behind the window
    delivered = await drain(bus, late)

    assert delivered == upto(CACHE_EVENTS + 100, after=50)
    # One page from the table, from its own cursor; the rest from the window.
    assert table.reads[reads_before:] == [(50, PAGE)]


async def test_a_subscriber_at_the_windows_edge_is_served_from_memory(
    bus: EventBus, table: Table
) -> None:
    live = bus.register(SESSION, 0)
    commit(bus, table, CACHE_EVENTS + 100)
    await drain(bus, live)
    reads_before = len(table.reads)

    edge = bus.register(SESSION, channel(bus).covered_from or 0)
    assert await drain(bus, edge) == upto(CACHE_EVENTS + 100, after=100)
    assert len(table.reads) == reads_before


async def test_a_subscriber_far_behind_catches_up_page_by_page_without_a_gap(
    bus: EventBus, table: Table
) -> None:
    live = bus.register(SESSION, 0)
    commit(bus, table, 3 * CACHE_EVENTS)
    await drain(bus, live)

    late = bus.register(SESSION, 7)
    assert await drain(bus, late) == upto(3 * CACHE_EVENTS, after=7)


# -- shared refreshes ------------------------------------------------------------


async def test_two_subscribers_woken_by_the_same_news_share_one_read(
    bus: EventBus, table: Table
) -> None:
    a = bus.register(SESSION, 0)
    b = bus.register(SESSION, 0)
    commit(bus, table, 5)
    assert a.woken and b.woken

    got_a, got_b = await asyncio.gather(bus.read(a), bus.read(b))

    assert seqs(got_a) == seqs(got_b) == upto(5)
    assert table.reads == [(0, CACHE_EVENTS)]

    commit(bus, table, 3)
    got_a, got_b = await asyncio.gather(bus.read(a), bus.read(b))
    assert seqs(got_a) == seqs(got_b) == [6, 7, 8]
    assert table.reads == [(0, CACHE_EVENTS), (5, CACHE_EVENTS)]


async def test_subscribers_waiting_on_a_refresh_are_all_served_when_it_ends(
    bus: EventBus, table: Table
) -> None:
    """A turn's end wakes every listener of its session at once: those that
    wait on the refresh in flight are handed the window together when it
    ends, not one after another, a pass of the event loop each (200 here
    took over 200 passes before). One of them cancelled meanwhile (its
    client gone) leaves the others' wait alone."""
    subs = [bus.register(SESSION, 0) for _ in range(200)]
    commit(bus, table, 5)
    table.hold = asyncio.Event()
    readers = [asyncio.ensure_future(bus.read(sub)) for sub in subs]
    await table.holding.wait()  # the first reader's refresh is in flight
    for _ in range(3):
        await asyncio.sleep(0)  # every other reader waits on it now
    readers[-1].cancel()
    table.hold.set()

    passes = 0
    while not all(r.done() for r in readers):
        await asyncio.sleep(0)
        passes += 1
    assert passes < 10, passes
    assert readers[-1].cancelled()
    assert all(seqs(r.result()) == upto(5) for r in readers[:-1])
    assert table.reads == [(0, CACHE_EVENTS)]


async def test_a_wake_up_during_a_refresh_makes_the_next_read_pick_up_the_new_events(
    bus: EventBus, table: Table
) -> None:
    sub = bus.register(SESSION, 0)
    commit(bus, table, 5)

    table.hold = asyncio.Event()
    reading = asyncio.ensure_future(bus.read(sub))
    await table.holding.wait()  # the refresh has its snapshot: events 1..5
    commit(bus, table, 3)  # 6..8 commit and wake the channel mid-read
    assert channel(bus).stale
    table.hold.set()
    table.hold = None

    assert seqs(await reading) == upto(5)
    assert channel(bus).stale  # the wake-up was not lost with the refresh
    assert sub.woken  # and the subscriber will come back for it
    assert seqs(await bus.read(sub)) == [6, 7, 8]
    assert await bus.read(sub) == []
    assert table.reads == [(0, CACHE_EVENTS), (5, CACHE_EVENTS)]


async def test_a_failed_refresh_leaves_the_channel_stale_for_the_next_read(
    bus: EventBus, table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = bus.register(SESSION, 0)
    commit(bus, table, 4)

    async def broken(conn: Any, **_: Any) -> list[EventRecord]:
        raise ConnectionError("server closed the connection")

    monkeypatch.setattr(db_reads, "events_after", broken)
    with pytest.raises(ConnectionError):
        await bus.read(sub)
    assert channel(bus).stale
    assert sub.cursor == 0

    monkeypatch.setattr(db_reads, "events_after", table.events_after)
    assert await drain(bus, sub) == upto(4)


# -- pages -----------------------------------------------------------------------


async def test_a_full_page_wakes_the_subscriber_again_so_it_comes_straight_back(
    bus: EventBus, table: Table
) -> None:
    sub = bus.register(SESSION, 0)
    commit(bus, table, 2 * PAGE + 10)

    first = await bus.read(sub)
    assert seqs(first) == upto(PAGE)
    assert sub.woken

    second = await bus.read(sub)
    assert seqs(second) == upto(2 * PAGE, after=PAGE)
    assert sub.woken

    last = await bus.read(sub)
    assert seqs(last) == upto(2 * PAGE + 10, after=2 * PAGE)
    assert not sub.woken  # a short page: nothing more to come back for
    assert sub.cursor == 2 * PAGE + 10
    assert bus.delivered == 2 * PAGE + 10


async def test_exactly_one_page_sets_woken_and_the_next_read_is_empty(
    bus: EventBus, table: Table
) -> None:
    sub = bus.register(SESSION, 0)
    commit(bus, table, PAGE)

    assert seqs(await bus.read(sub)) == upto(PAGE)
    assert sub.woken
    assert await bus.read(sub) == []
    assert not sub.woken


async def test_a_page_read_from_the_table_also_wakes_the_subscriber_again(
    bus: EventBus, table: Table
) -> None:
    live = bus.register(SESSION, 0)
    commit(bus, table, CACHE_EVENTS + 2 * PAGE)
    await drain(bus, live)
    covered_from = channel(bus).covered_from or 0

    late = bus.register(SESSION, 0)
    page = await bus.read(late)
    assert seqs(page) == upto(PAGE)
    assert table.reads[-1] == (0, PAGE)  # from the table: behind the window
    assert late.cursor < covered_from
    assert late.woken


async def test_a_subscriber_beyond_one_refresh_is_not_left_asleep(
    bus: EventBus, table: Table
) -> None:
    """A slow reader holds the window's high back while many events commit; a
    client resuming far beyond it must still get everything, with no further
    commit to wake it."""
    slow = bus.register(SESSION, 0)
    commit(bus, table, 10)
    assert await drain(bus, slow) == upto(10)
    commit(bus, table, 1990)
    resumed = bus.register(SESSION, 900)
    assert await bus.read(resumed) == []  # the window has not reached 900 yet...
    assert resumed.woken  # ...so it must come back, not wait for news
    delivered: list[int] = []
    while resumed.woken:
        delivered += seqs(await bus.read(resumed))
    assert delivered == upto(2000, after=900)
