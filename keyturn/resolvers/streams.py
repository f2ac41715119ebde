"""Subscriptions: a session's events from a cursor, and one turn's end."""

from __future__ import annotations

from collections.abc import AsyncIterator

from keyturn.db.rows import EventRecord
from keyturn.db.tables import Turn
from keyturn.errors import DatabaseUnavailable
from keyturn.resolvers.context import Context
from keyturn.resolvers.errors import NotFoundError, Unavailable
from keyturn.resolvers.sessions import check_after_seq, parse_id
from keyturn.runtime.watch import NotFound


async def session_events(
    ctx: Context, *, session_id: str, after_seq: int
) -> AsyncIterator[EventRecord]:
    check_after_seq(after_seq)
    sid = parse_id(session_id)
    if sid is None:
        raise NotFoundError(f"session {session_id} not found")
    try:
        async for event in ctx.runtime.session_events(sid, after_seq, tenant=ctx.tenant):
            yield event
    except NotFound as error:
        raise NotFoundError(str(error)) from None
    except DatabaseUnavailable as error:
        raise Unavailable() from error


async def turn_completed(ctx: Context, *, turn_id: str) -> AsyncIterator[Turn]:
    tid = parse_id(turn_id)
    if tid is None:
        raise NotFoundError(f"turn {turn_id} not found")
    try:
        async for turn in ctx.runtime.turn_completed(tid, tenant=ctx.tenant):
            yield turn
    except NotFound as error:
        raise NotFoundError(str(error)) from None
    except DatabaseUnavailable as error:
        raise Unavailable() from error
