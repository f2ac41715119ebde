"""Cancelling a turn, under a key."""

from __future__ import annotations

from keyturn.resolvers.context import Context
from keyturn.runtime.cancel import CancelRequest, CancelResult


async def cancel_turn(
    ctx: Context, *, turn_id: str, idempotency_key: str, reason: str | None
) -> CancelResult:
    """Raises InvalidRequest (naming the field) before anything is written."""
    request = CancelRequest.parse(turn_id=turn_id, idempotency_key=idempotency_key, reason=reason)
    return await ctx.runtime.cancel_turn(request, tenant=ctx.tenant)
