"""The tool ledger of a turn, and resolving an interrupted turn."""

from __future__ import annotations

from keyturn.db.tables import Turn
from keyturn.resolvers.context import Context
from keyturn.resolvers.failures import public_failures
from keyturn.runtime.ledger import ToolCallView
from keyturn.runtime.resolution import ResolutionAction, ResolutionRequest, ResolutionResult


async def tool_calls(ctx: Context, *, turn: Turn) -> list[ToolCallView]:
    # ``turn`` was found under ctx.tenant.
    async with public_failures():
        return await ctx.runtime.tool_calls(turn.id)


async def resolve_interrupted_turn(
    ctx: Context, *, turn_id: str, action: ResolutionAction, idempotency_key: str, force: bool
) -> ResolutionResult:
    """Raises InvalidRequest (naming the field) before anything is written."""
    request = ResolutionRequest.parse(
        turn_id=turn_id, action=action, idempotency_key=idempotency_key, force=force
    )
    async with public_failures():
        return await ctx.runtime.resolve_interrupted(request, tenant=ctx.tenant)
