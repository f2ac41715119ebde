"""Resolving an interrupted turn: RETRY or ABANDON, under a key."""

from __future__ import annotations

from keyturn.domain import ResolutionAction
from keyturn.resolvers.context import Context
from keyturn.runtime.resolution import ResolutionRequest, ResolutionResult


async def resolve_interrupted_turn(
    ctx: Context, *, turn_id: str, action: ResolutionAction, idempotency_key: str, force: bool
) -> ResolutionResult:
    """Raises InvalidRequest (naming the field) before anything is written."""
    request = ResolutionRequest.parse(
        turn_id=turn_id, action=action, idempotency_key=idempotency_key, force=force
    )
    return await ctx.runtime.resolve_interrupted(request, tenant=ctx.tenant)
