"""Sessions: create, delete, look up, list, and page through a session's turns and events."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from keyturn.db.records import EventRecord, SessionRecord, TurnRecord
from keyturn.domain import History, Multitask
from keyturn.errors import InvalidArgument
from keyturn.resolvers.context import Context, EventPageKey, TurnPageKey
from keyturn.resolvers.pagination import (
    Page,
    SeqWindow,
    check_first,
    decode_session_cursor,
    seq_cursors,
    seq_window,
    session_cursor,
)
from keyturn.runtime.deletion import DeletionRequest, DeletionResult


def parse_id(value: str) -> uuid.UUID | None:
    """Lookups by id answer null for an id that cannot exist."""
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


async def create_session(
    ctx: Context, *, default_history: History, multitask: Multitask = Multitask.ENQUEUE
) -> SessionRecord:
    return await ctx.runtime.create_session(
        tenant=ctx.tenant, default_history=default_history, multitask=multitask
    )


async def delete_session(ctx: Context, *, session_id: str, idempotency_key: str) -> DeletionResult:
    """Raises InvalidRequest (naming the field) before anything is written."""
    request = DeletionRequest.parse(session_id=session_id, idempotency_key=idempotency_key)
    return await ctx.runtime.delete_session(request, tenant=ctx.tenant)


async def get_session(ctx: Context, *, session_id: str) -> SessionRecord | None:
    sid = parse_id(session_id)
    if sid is None:
        return None
    return await ctx.runtime.reads.session(sid, tenant=ctx.tenant)


@dataclass(frozen=True, slots=True)
class EventsRead:
    """A page of a session's events read with the session itself, for its
    ``events`` field to answer without a read of its own."""

    key: EventPageKey
    rows: list[EventRecord]


async def get_session_with_events(
    ctx: Context,
    *,
    session_id: str,
    first: int | None = None,
    after: str | None = None,
    last: int | None = None,
    before: str | None = None,
    lean: bool = False,
) -> tuple[SessionRecord | None, EventsRead | None]:
    """:func:`get_session`, and the page of its events that ``events(first,
    after, last, before)`` on it asks for, in one round trip when that is a
    forward page. A window that is not, or is not valid, is left to the
    field (which reads, or answers the mistake, on its own). ``lean``: the
    answer reads nothing of an event but its seq, type and data (its other
    fields are then not read)."""
    sid = parse_id(session_id)
    if sid is None:
        return None, None
    try:
        window = seq_window(
            "event", first=first, after=after, last=last, before=before, default=100
        )
    except InvalidArgument:
        window = None
    if window is None or window.backward:
        return await ctx.runtime.reads.session(sid, tenant=ctx.tenant), None
    key = _event_page_key(sid, window)
    found, rows = await ctx.runtime.reads.session_with_events(
        sid, tenant=ctx.tenant, after=key.cursor, limit=key.limit, lean=lean
    )
    return found, EventsRead(key, rows) if found is not None else None


async def list_sessions(
    ctx: Context, *, first: int, after: str | None, count: bool = True
) -> Page[SessionRecord]:
    """A page of the tenant's sessions; their count only with ``count`` (it
    reads every session of the tenant, where the page reads an index range;
    without it the page's ``total`` is 0, for a document that selects none)."""
    limit = check_first(first)
    cursor = decode_session_cursor(after)
    rows, total = await ctx.runtime.reads.sessions(
        tenant=ctx.tenant, after=cursor, limit=limit + 1, count=count
    )
    items = rows[:limit]
    return Page(
        items,
        [session_cursor(s.created_at, s.id) for s in items],
        has_next=len(rows) > limit,
        total=total,
        has_previous=cursor is not None,
    )


# No seq is this high: "before the end" of a session.
_END = 2**63 - 1


async def session_turns(
    ctx: Context,
    *,
    session_id: uuid.UUID,
    first: int | None,
    after: str | None,
    last: int | None = None,
    before: str | None = None,
) -> Page[TurnRecord]:
    window = seq_window("turn", first=first, after=after, last=last, before=before, default=20)
    # Through the request's loader: a page of sessions reads all their turns at once.
    if window.backward:
        key = TurnPageKey(
            session_id, True, _END if window.cursor is None else window.cursor, window.limit + 1
        )
        rows, total = await ctx.loaders.turn_pages.load(key)
        items = rows[: window.limit][::-1]
        return Page(
            items,
            seq_cursors("turn", [t.admit_seq for t in items]),
            has_next=window.cursor is not None,
            total=total,
            has_previous=len(rows) > window.limit,
        )
    key = TurnPageKey(session_id, False, window.cursor or 0, window.limit + 1)
    rows, total = await ctx.loaders.turn_pages.load(key)
    items = rows[: window.limit]
    return Page(
        items,
        seq_cursors("turn", [t.admit_seq for t in items]),
        has_next=len(rows) > window.limit,
        total=total,
        has_previous=bool(window.cursor),
    )


async def session_events(
    ctx: Context,
    *,
    session_id: uuid.UUID,
    event_count: int,
    first: int | None,
    after: str | None,
    last: int | None = None,
    before: str | None = None,
    read: EventsRead | None = None,
) -> Page[EventRecord]:
    window = seq_window("event", first=first, after=after, last=last, before=before, default=100)
    key = _event_page_key(session_id, window)
    # Read with the session (get_session_with_events), or through the
    # request's loader: a page of sessions reads all their events at once.
    # seq is gapless, so the session's counter is its number of events.
    if read is not None and read.key == key:
        rows = read.rows
    else:
        rows = await ctx.loaders.session_events.load(key)
    if window.backward:
        items = rows[: window.limit][::-1]
        return Page(
            items,
            seq_cursors("event", [e.seq for e in items]),
            has_next=window.cursor is not None,
            total=event_count,
            has_previous=len(rows) > window.limit,
        )
    items = rows[: window.limit]
    return Page(
        items,
        seq_cursors("event", [e.seq for e in items]),
        has_next=len(rows) > window.limit,
        total=event_count,
        has_previous=bool(window.cursor),
    )


def _event_page_key(session_id: uuid.UUID, window: SeqWindow) -> EventPageKey:
    # One more row than the page holds: whether there is more.
    if window.backward:
        before = _END if window.cursor is None else window.cursor
        return EventPageKey(session_id, True, before, window.limit + 1)
    return EventPageKey(session_id, False, window.cursor or 0, window.limit + 1)


def check_after_seq(after_seq: int) -> int:
    if after_seq < 0:
        raise InvalidArgument("afterSeq must not be negative")
    return after_seq
