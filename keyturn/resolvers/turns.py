"""Turns: submit (admission), look up, a turn's events and its tool calls."""

from __future__ import annotations

from keyturn.db.records import EventRecord, TurnRecord
from keyturn.domain import History, Multitask
from keyturn.resolvers.context import Context
from keyturn.resolvers.sessions import parse_id
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


async def turn_events(ctx: Context, *, turn: TurnRecord) -> list[EventRecord]:
    # ``turn`` was found under ctx.tenant. Through the request's loader: a
    # page of turns reads all their events at once.
    return await ctx.loaders.turn_events.load(turn.id)


async def tool_calls(ctx: Context, *, turn: TurnRecord) -> list[ToolCallView]:
    """What the tool ledger establishes from the turn's events (read in the
    same batch as the turn's ``events`` when both are asked for)."""
    return ledger_tool_calls(await ctx.loaders.turn_events.load(turn.id))
