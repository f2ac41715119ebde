"""Sessions: create, delete, look up, list, and page through a session's turns and events."""

from __future__ import annotations

import uuid

from keyturn.db.records import EventRecord, SessionRecord, TurnRecord
from keyturn.domain import History, Multitask
from keyturn.errors import InvalidArgument
from keyturn.resolvers.context import Context, EventPageKey, TurnPageKey
from keyturn.resolvers.pagination import (
    Page,
    check_first,
    decode_session_cursor,
    seq_cursor,
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
            [seq_cursor("turn", t.admit_seq) for t in items],
            has_next=window.cursor is not None,
            total=total,
            has_previous=len(rows) > window.limit,
        )
    key = TurnPageKey(session_id, False, window.cursor or 0, window.limit + 1)
    rows, total = await ctx.loaders.turn_pages.load(key)
    items = rows[: window.limit]
    return Page(
        items,
        [seq_cursor("turn", t.admit_seq) for t in items],
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
) -> Page[EventRecord]:
    window = seq_window("event", first=first, after=after, last=last, before=before, default=100)
    # Through the request's loader: a page of sessions reads all their events at once.
    # seq is gapless, so the session's counter is its number of events.
    if window.backward:
        key = EventPageKey(
            session_id, True, _END if window.cursor is None else window.cursor, window.limit + 1
        )
        rows = await ctx.loaders.session_events.load(key)
        items = rows[: window.limit][::-1]
        return Page(
            items,
            [seq_cursor("event", e.seq) for e in items],
            has_next=window.cursor is not None,
            total=event_count,
            has_previous=len(rows) > window.limit,
        )
    key = EventPageKey(session_id, False, window.cursor or 0, window.limit + 1)
    rows = await ctx.loaders.session_events.load(key)
    items = rows[: window.limit]
    return Page(
        items,
        [seq_cursor("event", e.seq) for e in items],
        has_next=len(rows) > window.limit,
        total=event_count,
        has_previous=bool(window.cursor),
    )


def check_after_seq(after_seq: int) -> int:
    if after_seq < 0:
        raise InvalidArgument("afterSeq must not be negative")
    return after_seq
