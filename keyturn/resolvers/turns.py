"""Turns: submit (admission), look up, a turn's events and its tool calls."""

from __future__ import annotations

from keyturn.db.records import EventRecord, TurnRecord
from keyturn.domain import History, Multitask
from keyturn.errors import InvalidArgument
from keyturn.resolvers.context import Context, TurnEventsKey
from keyturn.resolvers.pagination import MAX_UNPAGED_TURN_EVENTS, check_first
from keyturn.resolvers.sessions import check_after_seq, parse_id
from keyturn.runtime.admission import Admission
from keyturn.runtime.ledger import ToolCallView
from keyturn.runtime.ledger import tool_calls as ledger_tool_calls
from keyturn.runtime.validation import TurnRequest


async def submit_turn(
    ctx: Context,
    *,
    session_id: str,
    idempotency_key: str,
    input: str,
    history: History | None,
    multitask: Multitask | None = None,
) -> Admission:
    """Raises InvalidRequest (naming the field) before anything is written."""
    request = TurnRequest.parse(
        session_id=session_id,
        idempotency_key=idempotency_key,
        input=input,
        history=history,
        multitask=multitask,
    )
    return await ctx.runtime.submit(request, tenant=ctx.tenant)


async def get_turn(ctx: Context, *, turn_id: str) -> TurnRecord | None:
    tid = parse_id(turn_id)
    if tid is None:
        return None
    return await ctx.runtime.reads.turn(tid, tenant=ctx.tenant)


async def turn_events(
    ctx: Context, *, turn: TurnRecord, first: int | None = None, after_seq: int | None = 0
) -> list[EventRecord]:
    """The turn's events with seq above ``after_seq``: ``first`` of them, or
    all of them when they are at most MAX_UNPAGED_TURN_EVENTS (more answers
    an error naming the way to page, never a list cut short)."""
    # ``turn`` was found under ctx.tenant. Through the request's loader: a
    # page of turns reads all their pages of events in one statement.
    after = check_after_seq(after_seq or 0)
    if first is not None:
        limit = check_first(first)
        return await ctx.loaders.turn_events.load(TurnEventsKey(turn.id, after, limit))
    bound = MAX_UNPAGED_TURN_EVENTS
    rows = await ctx.loaders.turn_events.load(TurnEventsKey(turn.id, after, bound + 1))
    if len(rows) > bound:
        raise InvalidArgument(
            f"this turn has more than {bound} events after seq {after}: ask for them in pages, "
            "events(first: N, afterSeq: the last seq read)"
        )
    return rows


async def tool_calls(ctx: Context, *, turn: TurnRecord) -> list[ToolCallView]:
    """What the tool ledger establishes from the turn's ``tool.*`` events (a
    page of turns reads them in one statement, which returns none of their
    deltas)."""
    return ledger_tool_calls(await ctx.loaders.tool_events.load(turn.id))
