"""Sessions: create, look up, list, and page through a session's turns and events."""

from __future__ import annotations

import uuid

from keyturn.db.records import EventRecord, SessionRecord, TurnRecord
from keyturn.domain import History
from keyturn.errors import InvalidArgument
from keyturn.resolvers.context import Context
from keyturn.resolvers.pagination import (
    Page,
    check_first,
    decode_seq_cursor,
    decode_session_cursor,
    seq_cursor,
    session_cursor,
)


def parse_id(value: str) -> uuid.UUID | None:
    """Lookups by id answer null for an id that cannot exist."""
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


async def create_session(ctx: Context, *, default_history: History) -> SessionRecord:
    return await ctx.runtime.create_session(tenant=ctx.tenant, default_history=default_history)


async def get_session(ctx: Context, *, session_id: str) -> SessionRecord | None:
    sid = parse_id(session_id)
    if sid is None:
        return None
    return await ctx.runtime.reads.session(sid, tenant=ctx.tenant)


async def list_sessions(ctx: Context, *, first: int, after: str | None) -> Page[SessionRecord]:
    limit = check_first(first)
    cursor = decode_session_cursor(after)
    rows, total = await ctx.runtime.reads.sessions(tenant=ctx.tenant, after=cursor, limit=limit + 1)
    items = rows[:limit]
    return Page(
        items, [session_cursor(s.created_at, s.id) for s in items], len(rows) > limit, total
    )


async def session_turns(
    ctx: Context, *, session_id: uuid.UUID, first: int, after: str | None
) -> Page[TurnRecord]:
    limit = check_first(first)
    cursor = decode_seq_cursor("turn", after)
    rows, total = await ctx.runtime.reads.turns(
        session_id=session_id, after=cursor, limit=limit + 1
    )
    items = rows[:limit]
    return Page(items, [seq_cursor("turn", t.admit_seq) for t in items], len(rows) > limit, total)


async def session_events(
    ctx: Context, *, session_id: uuid.UUID, event_count: int, first: int, after: str | None
) -> Page[EventRecord]:
    limit = check_first(first)
    cursor = decode_seq_cursor("event", after)
    rows = await ctx.runtime.reads.events(session_id=session_id, after=cursor, limit=limit + 1)
    items = rows[:limit]
    # seq is gapless, so the session's counter is its number of events.
    return Page(items, [seq_cursor("event", e.seq) for e in items], len(rows) > limit, event_count)


def check_after_seq(after_seq: int) -> int:
    if after_seq < 0:
        raise InvalidArgument("afterSeq must not be negative")
    return after_seq
