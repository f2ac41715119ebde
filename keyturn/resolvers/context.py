"""What every resolver receives: the process's runtime, and the request's loaders."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from strawberry.dataloader import DataLoader

from keyturn.db.records import EventRecord, TurnRecord
from keyturn.runtime.process import Runtime
from keyturn.runtime.reads import Reads
from keyturn.settings import DEFAULT_MAX_QUERY_COST, DEFAULT_MAX_RESPONSE_BYTES, Settings


@dataclass(frozen=True, slots=True)
class QueryLimits:
    """What one operation may cost before it runs, and how large its answer may grow."""

    max_query_cost: int = DEFAULT_MAX_QUERY_COST
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES

    @classmethod
    def of(cls, settings: Settings) -> QueryLimits:
        return cls(settings.max_query_cost, settings.max_response_bytes)


@dataclass(frozen=True, slots=True)
class TurnPageKey:
    """One session's page of turns: the window of keyturn.resolvers.sessions."""

    session_id: uuid.UUID
    backward: bool
    cursor: int  # after (forward) or before (backward)
    limit: int  # rows to read: the page's size plus one, to tell whether there is more


_DEFAULT_LIMITS = QueryLimits()  # frozen: one shared by every context that names none

TurnPage = tuple[list[TurnRecord], int]  # the rows, and the session's count of turns


@dataclass(frozen=True, slots=True)
class EventPageKey:
    """One session's page of events: the window of keyturn.resolvers.sessions."""

    session_id: uuid.UUID
    backward: bool
    cursor: int  # after (forward) or before (backward)
    limit: int  # rows to read: the page's size plus one, to tell whether there is more


@dataclass(frozen=True, slots=True)
class TurnEventsKey:
    """A turn's events from seq ``after`` on: at most ``limit`` of them."""

    turn_id: uuid.UUID
    after: int
    limit: int


class Loaders:
    """Batches the reads a page of sessions or turns makes for each of its
    rows: every session's turns, every turn's page of events, every turn's
    tool events (its tool calls), in one statement per level instead of one
    per row.

    Nothing is cached (``cache=False``): a WebSocket connection keeps one
    context for as long as it stays open, and a cache there would answer a
    later operation with what an earlier one read. A turn's page of events
    and its tool calls are separate reads: the tool ledger needs every
    ``tool.*`` event of the turn and nothing else, a page needs a bounded
    window of all of them, and neither is cut from the other (a streamed
    turn may have thousands of ``turn.delta`` events that the tool calls
    must not read).

    Each loader is made when a resolver first asks for it: a WebSocket that
    only waits for a subscription's events never does, and would otherwise
    hold four loaders for as long as it stays open. A loader's function is
    bound to the reads, not to these loaders: bound to them it made a
    reference cycle, and a request's context and everything it read waited
    for the cycle collector rather than going when the request ended.
    """

    __slots__ = ("_reads", "_session_events", "_tool_events", "_turn_events", "_turn_pages")

    def __init__(self, reads: Reads) -> None:
        self._reads = reads
        self._turn_pages: DataLoader[TurnPageKey, TurnPage] | None = None
        self._session_events: DataLoader[EventPageKey, list[EventRecord]] | None = None
        self._turn_events: DataLoader[TurnEventsKey, list[EventRecord]] | None = None
        self._tool_events: DataLoader[uuid.UUID, list[EventRecord]] | None = None

    @property
    def turn_pages(self) -> DataLoader[TurnPageKey, TurnPage]:
        if self._turn_pages is None:
            self._turn_pages = DataLoader(partial(_load_turn_pages, self._reads), cache=False)
        return self._turn_pages

    @property
    def session_events(self) -> DataLoader[EventPageKey, list[EventRecord]]:
        if self._session_events is None:
            self._session_events = DataLoader(
                partial(_load_session_events, self._reads), cache=False
            )
        return self._session_events

    @property
    def turn_events(self) -> DataLoader[TurnEventsKey, list[EventRecord]]:
        if self._turn_events is None:
            self._turn_events = DataLoader(partial(_load_turn_events, self._reads), cache=False)
        return self._turn_events

    @property
    def tool_events(self) -> DataLoader[uuid.UUID, list[EventRecord]]:
        """By turn id: the turn's ``tool.*`` events, what its tool calls are made of."""
        if self._tool_events is None:
            self._tool_events = DataLoader(partial(_load_tool_events, self._reads), cache=False)
        return self._tool_events


async def _load_turn_pages(reads: Reads, keys: list[TurnPageKey]) -> list[TurnPage]:
    # Sessions of one page all ask for the same window; one statement per window.
    found: dict[TurnPageKey, TurnPage] = {}
    for (backward, cursor, limit), session_ids in _windows(keys).items():
        if backward:
            pages = await reads.turns_before_batch(
                session_ids=session_ids, before=cursor, limit=limit
            )
        else:
            pages = await reads.turns_batch(session_ids=session_ids, after=cursor, limit=limit)
        for sid, page in pages.items():
            found[TurnPageKey(sid, backward, cursor, limit)] = page
    return [found[key] for key in keys]


async def _load_session_events(reads: Reads, keys: list[EventPageKey]) -> list[list[EventRecord]]:
    # As for turns: one statement per window; a window asked for by one
    # session alone (Query.session) reads it with the single-session statement.
    found: dict[EventPageKey, list[EventRecord]] = {}
    for (backward, cursor, limit), session_ids in _windows(keys).items():
        pages: dict[uuid.UUID, list[EventRecord]]
        if len(set(session_ids)) == 1:
            [sid] = set(session_ids)
            if backward:
                rows = await reads.events_before(session_id=sid, before=cursor, limit=limit)
            else:
                rows = await reads.events(session_id=sid, after=cursor, limit=limit)
            pages = {sid: rows}
        elif backward:
            pages = await reads.events_before_batch(
                session_ids=session_ids, before=cursor, limit=limit
            )
        else:
            pages = await reads.events_batch(session_ids=session_ids, after=cursor, limit=limit)
        for sid, page in pages.items():
            found[EventPageKey(sid, backward, cursor, limit)] = page
    return [found[key] for key in keys]


async def _load_turn_events(reads: Reads, keys: list[TurnEventsKey]) -> list[list[EventRecord]]:
    # A page of turns all ask for the same window: one statement per window.
    windows: dict[tuple[int, int], list[uuid.UUID]] = defaultdict(list)
    for key in keys:
        windows[(key.after, key.limit)].append(key.turn_id)
    pages: dict[TurnEventsKey, list[EventRecord]] = {}
    for (after, limit), turn_ids in windows.items():
        got = await reads.turn_event_pages(turn_ids, after=after, limit=limit)
        for tid, rows in got.items():
            pages[TurnEventsKey(tid, after, limit)] = rows
    return [pages[key] for key in keys]


async def _load_tool_events(reads: Reads, turn_ids: list[uuid.UUID]) -> list[list[EventRecord]]:
    found = await reads.tool_events_of_turns(turn_ids)
    return [found[tid] for tid in turn_ids]


@dataclass(slots=True)
class Context:
    runtime: Runtime
    request: Any = None
    response: Any = None
    # The caller's tenant, from its token ("" when the server runs open).
    tenant: str = ""
    # The WebSocket connection_init payload (set by Strawberry).
    connection_params: dict[str, Any] | None = None
    limits: QueryLimits = _DEFAULT_LIMITS
    # Made on first use (see Loaders): most WebSockets never need them.
    _loaders: Loaders | None = field(default=None, init=False, repr=False)
    # How much of its answer's budget an operation has spent is kept per
    # operation (keyturn.schema.budget), not here: one WebSocket's
    # operations share this context.

    @property
    def loaders(self) -> Loaders:
        if self._loaders is None:
            self._loaders = Loaders(self.runtime.reads)
        return self._loaders


def _windows(
    keys: Sequence[TurnPageKey | EventPageKey],
) -> dict[tuple[bool, int, int], list[uuid.UUID]]:
    """The sessions of a batch by the window each asks for: a page of sessions
    all ask for the same one, read in one statement."""
    windows: dict[tuple[bool, int, int], list[uuid.UUID]] = defaultdict(list)
    for key in keys:
        windows[(key.backward, key.cursor, key.limit)].append(key.session_id)
    return windows
