"""Global Object Identification (Relay): any session, turn or event by its id.

Ids are what the types already expose: a session's or a turn's UUID, an
event's number. The two forms cannot be confused, and UUIDs are unique across
tables, so an id names one object; lookups name the caller's tenant, so
another tenant's id reads as null.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from keyturn.db.records import EventRecord, SessionRecord, TurnRecord
from keyturn.errors import InvalidArgument
from keyturn.resolvers.context import Context
from keyturn.resolvers.pagination import MAX_FIRST
from keyturn.resolvers.sessions import parse_id

NodeRecord = SessionRecord | TurnRecord | EventRecord


def _parse(id: str) -> uuid.UUID | int | None:
    """An event's number, a session's or turn's UUID, or None for an id that cannot exist."""
    if id.isascii() and id.isdigit():
        # Past 2**63 (and past int()'s 4,300 digits) no event has that id.
        return int(id) if len(id) <= 19 and int(id) < 2**63 else None
    return parse_id(id)


async def node(ctx: Context, *, id: str) -> NodeRecord | None:
    [found] = await nodes(ctx, ids=[id])
    return found


async def nodes(ctx: Context, *, ids: Sequence[str]) -> list[NodeRecord | None]:
    """In the order asked, null for an unknown or another tenant's id: one
    statement per kind of id (sessions, then turns among the UUIDs that are
    no session, events), not one per id."""
    if len(ids) > MAX_FIRST:
        raise InvalidArgument(f"ids must name at most {MAX_FIRST} objects (got {len(ids)})")
    parsed = [_parse(i) for i in ids]
    uuids = list(dict.fromkeys(p for p in parsed if isinstance(p, uuid.UUID)))
    numbers = list(dict.fromkeys(p for p in parsed if isinstance(p, int)))
    if not uuids and not numbers:
        return [None for _ in ids]
    found = await ctx.runtime.reads.nodes(tenant=ctx.tenant, uuids=uuids, numbers=numbers)
    return [found.get(p) if p is not None else None for p in parsed]
