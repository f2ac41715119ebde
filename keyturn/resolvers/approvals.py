"""Deciding a tool call that waits for approval, and listing those that wait."""

from __future__ import annotations

from keyturn.resolvers.context import Context
from keyturn.resolvers.pagination import Page, check_first, decode_seq_cursor, seq_cursors
from keyturn.runtime.approval import (
    DecisionRequest,
    DecisionResult,
    PendingApproval,
    ToolCallDecision,
)

CURSOR_KIND = "approval"


async def decide_tool_call(
    ctx: Context,
    *,
    turn_id: str,
    index: int,
    decision: ToolCallDecision,
    idempotency_key: str,
    note: str | None,
) -> DecisionResult:
    """Raises InvalidRequest (naming the field) before anything is written."""
    request = DecisionRequest.parse(
        turn_id=turn_id,
        index=index,
        decision=decision,
        idempotency_key=idempotency_key,
        note=note,
    )
    return await ctx.runtime.decide_tool_call(request, tenant=ctx.tenant)


async def pending_approvals(
    ctx: Context, *, first: int, after: str | None
) -> Page[PendingApproval]:
    """The caller's tenant's calls that wait for a decision, oldest request first."""
    limit = check_first(first)
    cursor = decode_seq_cursor(CURSOR_KIND, after)
    items, more = await ctx.runtime.pending_approvals(tenant=ctx.tenant, after=cursor, limit=limit)
    return Page(
        items=items,
        cursors=seq_cursors(CURSOR_KIND, [p.cursor for p in items]),
        has_next=more,
        total=len(items),
        has_previous=after is not None,
    )
