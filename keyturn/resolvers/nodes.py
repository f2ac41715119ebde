"""Global Object Identification (Relay): any session, turn or event by its id.

Ids are what the types already expose: a session's or a turn's UUID, an
event's number. The two forms cannot be confused, and UUIDs are unique across
tables, so an id names one object; lookups name the caller's tenant, so
another tenant's id reads as null.
"""

from __future__ import annotations

from collections.abc import Sequence

from keyturn.db.records import EventRecord, SessionRecord, TurnRecord
from keyturn.errors import InvalidArgument
from keyturn.resolvers.context import Context
from keyturn.resolvers.pagination import MAX_FIRST
from keyturn.resolvers.sessions import parse_id

NodeRecord = SessionRecord | TurnRecord | EventRecord


async def node(ctx: Context, *, id: str) -> NodeRecord | None:
    if id.isdigit():
        number = int(id)
        if number >= 2**63:
            return None  # beyond any event's id
        return await ctx.runtime.reads.event(number, tenant=ctx.tenant)
    uid = parse_id(id)
    if uid is None:
        return None
    found: NodeRecord | None = await ctx.runtime.reads.session(uid, tenant=ctx.tenant)
    if found is None:
        found = await ctx.runtime.reads.turn(uid, tenant=ctx.tenant)
    return found


async def nodes(ctx: Context, *, ids: Sequence[str]) -> list[NodeRecord | None]:
    if len(ids) > MAX_FIRST:
        raise InvalidArgument(f"ids must name at most {MAX_FIRST} objects (got {len(ids)})")
    return [await node(ctx, id=i) for i in ids]
