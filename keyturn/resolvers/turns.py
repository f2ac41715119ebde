"""Turns: submit (admission), look up, list a turn's events."""

from __future__ import annotations

from keyturn.db.rows import EventRecord
from keyturn.db.tables import Turn
from keyturn.resolvers.context import Context
from keyturn.resolvers.failures import public_failures
from keyturn.resolvers.sessions import parse_id
from keyturn.runtime.admission import Admission
from keyturn.runtime.requests import History, TurnRequest


async def submit_turn(
    ctx: Context, *, session_id: str, idempotency_key: str, input: str, history: History | None
) -> Admission:
    """Raises InvalidRequest (naming the field) before anything is written."""
    request = TurnRequest.parse(
        session_id=session_id, idempotency_key=idempotency_key, input=input, history=history
    )
    async with public_failures():
        return await ctx.runtime.submit(request, tenant=ctx.tenant)


async def get_turn(ctx: Context, *, turn_id: str) -> Turn | None:
    tid = parse_id(turn_id)
    if tid is None:
        return None
    async with public_failures():
        return await ctx.runtime.turn(tid, tenant=ctx.tenant)


async def turn_events(ctx: Context, *, turn: Turn) -> list[EventRecord]:
    async with public_failures():
        return await ctx.runtime.turn_events(turn.id)
