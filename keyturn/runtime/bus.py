"""The event bus: live delivery of committed events to subscribers.

A wake-up says only "session S has news". Each session with subscribers has a
channel that, when woken, reads the new events from the table once and keeps
the latest few hundred; every subscriber then takes what lies after its own
cursor. A subscriber whose cursor fell behind that window reads the table
itself. So memory per subscriber is a cursor and a flag, nothing is lost
(the table is read from the cursor) and nothing is sent twice (the cursor only
moves forward).

Subscribers register *before* their first read: an event that commits after
registration wakes them, one that committed before is in the read.

A deleted session wakes its channel like news does. The refresh that then
finds no new event asks whether the session still exists; when it does not,
every subscriber's next read raises :class:`~keyturn.errors.SessionDeleted`
(the safety-net poll wakes a channel whose session has gone, too, should the
wake-up be missed).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar, cast

from keyturn.db import reads
from keyturn.db.engine import Engine, connect
from keyturn.db.records import EventRecord
from keyturn.errors import DatabaseUnavailable, SessionDeleted

log = logging.getLogger(__name__)

T = TypeVar("T")
CACHE_EVENTS = 512
PAGE = 200
READ_ATTEMPTS = 8  # about 4 s of retries


class SharedReads:
    """Identical reads that arrive together share one query, and its answer is
    kept a moment: when a turn ends, every listener of it reads the same
    (immutable) row, and a thousand listeners must not mean a thousand queries."""

    def __init__(self, *, keep_s: float = 2.0, max_kept: int = 4096) -> None:
        self._keep_s = keep_s
        self._max_kept = max_kept
        self._inflight: dict[Hashable, asyncio.Future[Any]] = {}
        self._kept: dict[Hashable, tuple[float, Any]] = {}

    async def get(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        now = time.monotonic()
        kept = self._kept.get(key)
        if kept is not None and now - kept[0] < self._keep_s:
            return cast(T, kept[1])
        future = self._inflight.get(key)
        if future is None:
            future = asyncio.ensure_future(read())
            self._inflight[key] = future
            future.add_done_callback(lambda f: self._settle(key, f))
        return cast(T, await asyncio.shield(future))

    def _settle(self, key: Hashable, future: asyncio.Future[Any]) -> None:
        self._inflight.pop(key, None)
        if future.cancelled() or future.exception() is not None:
            return
        if len(self._kept) >= self._max_kept:
            cutoff = time.monotonic() - self._keep_s
            self._kept = {k: v for k, v in self._kept.items() if v[0] >= cutoff}
            if len(self._kept) >= self._max_kept:
                self._kept.clear()
        self._kept[key] = (time.monotonic(), future.result())


class Subscriber:
    """A cursor and a wake-up flag. Not an :class:`asyncio.Event`: an idle
    subscription lives for as long as its client waits, and an Event's
    deque of waiters would be most of its size; a subscriber has one waiter
    at most, its own stream, so a future made when it waits does the same."""

    __slots__ = ("_waiter", "_woken", "cursor", "session_id")

    def __init__(self, session_id: uuid.UUID, cursor: int) -> None:
        self.session_id = session_id
        self.cursor = cursor
        self._woken = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def woken(self) -> bool:
        return self._woken

    def wake(self) -> None:
        self._woken = True
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._woken = False

    def wait(self) -> asyncio.Future[None]:
        """Done once woken (at once if it already is)."""
        waiter = asyncio.get_running_loop().create_future()
        if self._woken:
            waiter.set_result(None)
        else:
            self._waiter = waiter
        return waiter


class _Channel:
    def __init__(self) -> None:
        self.subscribers: set[Subscriber] = set()
        # The cache holds every event with covered_from < seq <= high.
        self.cache: collections.deque[EventRecord] = collections.deque(maxlen=CACHE_EVENTS)
        self.covered_from: int | None = None
        self.high: int | None = None
        self.stale = True
        # The last refresh found the session deleted.
        self.gone = False
        # Done when the refresh in flight ends. A future, not a lock: a
        # turn's end wakes every listener of its session at once, and a
        # lock handed them the window one after another, each woken by
        # the one before, a pass of the event loop apiece; the future's
        # end wakes them all in one.
        self.refreshing: asyncio.Future[None] | None = None


class EventBus:
    def __init__(self, engine: Engine, *, poll_s: float) -> None:
        self._engine = engine
        self._poll_s = poll_s
        self._channels: dict[uuid.UUID, _Channel] = {}
        # Set by the runtime: tells other processes (via NOTIFY) about news.
        self.broadcast: Callable[[uuid.UUID], None] | None = None
        self.shared = SharedReads()
        self.delivered = 0

    # -- lifecycle ---------------------------------------------------------
    def stop(self) -> None:
        """Wake every subscriber (their streams end as the server stops)."""
        for channel in self._channels.values():
            for sub in channel.subscribers:
                sub.wake()

    @property
    def subscriber_count(self) -> int:
        return sum(len(c.subscribers) for c in self._channels.values())

    # -- wake-ups ----------------------------------------------------------
    def committed(self, session_id: uuid.UUID) -> None:
        """A transaction of this process committed an event of ``session_id``."""
        self.wake(session_id)
        if self.broadcast is not None:
            self.broadcast(session_id)

    def wake(self, session_id: uuid.UUID) -> None:
        channel = self._channels.get(session_id)
        if channel is None:
            return
        channel.stale = True
        for sub in channel.subscribers:
            sub.wake()

    def wake_all(self) -> None:
        """After a lost listener connection: everyone re-reads from their cursor."""
        for session_id in list(self._channels):
            self.wake(session_id)

    # -- subscribers -------------------------------------------------------
    def register(self, session_id: uuid.UUID, cursor: int) -> Subscriber:
        sub = Subscriber(session_id, cursor)
        self._channels.setdefault(session_id, _Channel()).subscribers.add(sub)
        return sub

    def unregister(self, sub: Subscriber) -> None:
        channel = self._channels.get(sub.session_id)
        if channel is None:
            return
        channel.subscribers.discard(sub)
        if not channel.subscribers:
            del self._channels[sub.session_id]

    async def read(self, sub: Subscriber) -> list[EventRecord]:
        """Events after ``sub.cursor`` in seq order (at most a page); advances the cursor.
        Raises SessionDeleted once the session is gone and nothing is left to send.

        A connection lost mid-read (a restart, ``pg_terminate_backend``) is
        retried on a fresh one for a few seconds before the subscriber is told
        (it then resumes from its cursor): a blip should not end a stream.
        """
        delay = 0.05
        for _attempt in range(READ_ATTEMPTS - 1):
            try:
                return await self._read(sub)
            except DatabaseUnavailable:
                log.warning("subscriber read failed: database unavailable; retrying")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        return await self._read(sub)

    async def _read(self, sub: Subscriber) -> list[EventRecord]:
        sub.clear()
        channel = self._channels[sub.session_id]
        # Always through the refresh: one already in flight (started by
        # another subscriber woken by the same news) must finish before this
        # subscriber looks at the cache.
        await self._refresh(sub.session_id, channel, sub.cursor)
        if channel.covered_from is not None and sub.cursor >= channel.covered_from:
            events = [e for e in channel.cache if e.seq > sub.cursor][:PAGE]
        else:
            # Fell behind the shared window: read the table from this cursor.
            async with connect(self._engine) as conn:
                events = await reads.events_after(
                    conn, session_id=sub.session_id, after=sub.cursor, limit=PAGE
                )
        if events:
            sub.cursor = events[-1].seq
            self.delivered += len(events)
        elif channel.gone:
            raise SessionDeleted(sub.session_id)
        if len(events) == PAGE or channel.stale:
            # There may be more: a full page, or a window that stopped short
            # of the table's end (a refresh reads at most CACHE_EVENTS) or was
            # woken again meanwhile. Come straight back rather than wait for
            # news that has already committed.
            sub.wake()
        return events

    def wait(self, sub: Subscriber) -> Awaitable[None]:
        # A future, not a coroutine: nothing more per idle subscriber than it.
        return sub.wait()

    async def _refresh(self, session_id: uuid.UUID, channel: _Channel, cursor: int) -> None:
        while channel.refreshing is not None:
            # Shielded: a waiter cancelled (its client gone) must not cancel
            # the others' wait. When it ends, look again: the refresh may
            # have failed (the channel is then stale), or news came meanwhile.
            await asyncio.shield(channel.refreshing)
        if not channel.stale:
            return
        done = channel.refreshing = asyncio.get_running_loop().create_future()
        try:
            await self._read_window(session_id, channel, cursor)
        finally:
            channel.refreshing = None
            done.set_result(None)

    async def _read_window(self, session_id: uuid.UUID, channel: _Channel, cursor: int) -> None:
        # Cleared before the read: a wake-up that lands during the read
        # marks the channel stale again, so nothing committed is missed.
        channel.stale = False
        after = channel.high if channel.high is not None else cursor
        try:
            async with connect(self._engine) as conn:
                events = await reads.events_after(
                    conn, session_id=session_id, after=after, limit=CACHE_EVENTS
                )
                if not events:
                    # Woken without news: perhaps the session was deleted.
                    seqs = await reads.session_seqs(conn, session_ids=[session_id])
                    channel.gone = session_id not in seqs
        except BaseException:
            channel.stale = True
            raise
        if channel.high is None:
            channel.covered_from = cursor
            channel.high = cursor
        channel.cache.extend(events)  # the deque drops the oldest
        if events:
            channel.high = events[-1].seq
        if len(channel.cache) == CACHE_EVENTS and channel.covered_from is not None:
            # The window slid: it now covers only what it still holds.
            channel.covered_from = max(channel.covered_from, channel.cache[0].seq - 1)
        if len(events) == CACHE_EVENTS:
            channel.stale = True  # more to read next time

    async def poll_forever(self) -> None:
        """Safety net (supervised): finds news that no wake-up announced."""
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                await self._poll_once()
            except DatabaseUnavailable:
                log.warning("subscription poll: database unavailable")

    async def _poll_once(self) -> None:
        ids = [sid for sid, ch in self._channels.items() if ch.high is not None]
        if ids:
            async with connect(self._engine) as conn:
                seqs = await reads.session_seqs(conn, session_ids=ids)
            for sid, seq in seqs.items():
                channel = self._channels.get(sid)
                if channel is not None and channel.high is not None and seq > channel.high:
                    log.info("subscription poll found news no wake-up announced")
                    self.wake(sid)
            for sid in set(ids) - set(seqs):
                log.info("subscription poll found a deleted session no wake-up announced")
                self.wake(sid)
