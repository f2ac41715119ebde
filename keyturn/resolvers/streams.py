"""Subscriptions: a session's events from a cursor, one turn's events, and one turn's end.

Each hands back the runtime's own stream rather than wrapping it in a
generator of its own: a subscription waits inside that stream for as long as
its client listens, and every wrapper would be one more frame it holds. A bad
id raises here, when the subscription's resolver calls this, which is while
its stream is first read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from keyturn.db.records import EventRecord, TurnRecord
from keyturn.errors import NotFound
from keyturn.resolvers.context import Context
from keyturn.resolvers.sessions import check_after_seq, parse_id


def session_events(ctx: Context, *, session_id: str, after_seq: int) -> AsyncIterator[EventRecord]:
    check_after_seq(after_seq)
    sid = parse_id(session_id)
    if sid is None:
        raise NotFound(f"session {session_id} not found")
    return ctx.runtime.session_events(sid, after_seq, tenant=ctx.tenant)


def turn_completed(ctx: Context, *, turn_id: str) -> AsyncIterator[TurnRecord]:
    tid = parse_id(turn_id)
    if tid is None:
        raise NotFound(f"turn {turn_id} not found")
    return ctx.runtime.turn_completed(tid, tenant=ctx.tenant)


def turn_events(ctx: Context, *, turn_id: str, after_seq: int) -> AsyncIterator[EventRecord]:
    check_after_seq(after_seq)
    tid = parse_id(turn_id)
    if tid is None:
        raise NotFound(f"turn {turn_id} not found")
    return ctx.runtime.turn_events(tid, after_seq, tenant=ctx.tenant)
