"""Reads of the record, and the one plain insert (a new session)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from keyturn.db.rows import (
    EVENT_COLUMNS,
    SESSION_COLUMNS,
    TURN_COLUMNS,
    EventRecord,
    event_from_row,
    session_from_row,
    turn_from_row,
)
from keyturn.db.tables import Session, Turn

# Every lookup a client can cause names the tenant: another tenant's session,
# turn or events read exactly as "not found".
_CREATE_SESSION = text(
    f"INSERT INTO sessions (id, tenant, default_history) VALUES (:id, :tenant, :default_history) "
    f"RETURNING {SESSION_COLUMNS}"
)
_SESSION = text(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = :id AND tenant = :tenant")
_SESSIONS_AFTER = text(
    f"SELECT {SESSION_COLUMNS} FROM sessions "
    "WHERE tenant = :tenant AND (CAST(:after_ts AS timestamptz) IS NULL "
    "OR (created_at, id) > (:after_ts, :after_id)) "
    "ORDER BY created_at, id LIMIT :limit"
)
_SESSION_COUNT = text("SELECT count(*) FROM sessions WHERE tenant = :tenant")
_TURN = text(
    f"SELECT {', '.join('t.' + c.strip() for c in TURN_COLUMNS.split(','))} "
    "FROM turns t JOIN sessions s ON s.id = t.session_id WHERE t.id = :id AND s.tenant = :tenant"
)
_TURNS_AFTER = text(
    f"SELECT {TURN_COLUMNS} FROM turns WHERE session_id = :session_id AND admit_seq > :after "
    "ORDER BY admit_seq LIMIT :limit"
)
_TURN_COUNT = text("SELECT count(*) FROM turns WHERE session_id = :session_id")
_EVENTS_AFTER = text(
    f"SELECT {EVENT_COLUMNS} FROM events WHERE session_id = :session_id AND seq > :after "
    "ORDER BY seq LIMIT :limit"
)
_TURN_EVENTS = text(f"SELECT {EVENT_COLUMNS} FROM events WHERE turn_id = :turn_id ORDER BY seq")
# One snapshot for both: if the turn is not terminal here, its terminal event
# will carry a seq above this session's counter.
_TURN_AND_SEQ = text(
    f"SELECT {', '.join('t.' + c.strip() for c in TURN_COLUMNS.split(','))}, "
    "s.event_seq AS session_event_seq "
    "FROM turns t JOIN sessions s ON s.id = t.session_id WHERE t.id = :id AND s.tenant = :tenant"
)
_SEQS = text("SELECT id, event_seq FROM sessions WHERE id = ANY(:ids)")


async def create_session(conn: AsyncConnection, *, tenant: str, default_history: str) -> Session:
    row = (
        await conn.execute(
            _CREATE_SESSION,
            {"id": uuid.uuid4(), "tenant": tenant, "default_history": default_history},
        )
    ).one()
    return session_from_row(row)


async def session(conn: AsyncConnection, *, tenant: str, session_id: uuid.UUID) -> Session | None:
    row = (await conn.execute(_SESSION, {"id": session_id, "tenant": tenant})).first()
    return session_from_row(row) if row is not None else None


async def sessions_after(
    conn: AsyncConnection, *, tenant: str, after: tuple[datetime, uuid.UUID] | None, limit: int
) -> list[Session]:
    after_ts, after_id = after if after is not None else (None, None)
    rows = (
        await conn.execute(
            _SESSIONS_AFTER,
            {"tenant": tenant, "after_ts": after_ts, "after_id": after_id, "limit": limit},
        )
    ).all()
    return [session_from_row(r) for r in rows]


async def session_count(conn: AsyncConnection, *, tenant: str) -> int:
    return int((await conn.execute(_SESSION_COUNT, {"tenant": tenant})).scalar_one())


async def turn(conn: AsyncConnection, *, tenant: str, turn_id: uuid.UUID) -> Turn | None:
    row = (await conn.execute(_TURN, {"id": turn_id, "tenant": tenant})).first()
    return turn_from_row(row) if row is not None else None


async def turn_with_session_seq(
    conn: AsyncConnection, *, tenant: str, turn_id: uuid.UUID
) -> tuple[Turn, int] | None:
    row = (await conn.execute(_TURN_AND_SEQ, {"id": turn_id, "tenant": tenant})).first()
    if row is None:
        return None
    return turn_from_row(row), int(row.session_event_seq)


async def turns_after(
    conn: AsyncConnection, *, session_id: uuid.UUID, after: int, limit: int
) -> list[Turn]:
    rows = (
        await conn.execute(_TURNS_AFTER, {"session_id": session_id, "after": after, "limit": limit})
    ).all()
    return [turn_from_row(r) for r in rows]


async def turn_count(conn: AsyncConnection, *, session_id: uuid.UUID) -> int:
    return int((await conn.execute(_TURN_COUNT, {"session_id": session_id})).scalar_one())


async def events_after(
    conn: AsyncConnection, *, session_id: uuid.UUID, after: int, limit: int
) -> list[EventRecord]:
    rows = (
        await conn.execute(
            _EVENTS_AFTER, {"session_id": session_id, "after": after, "limit": limit}
        )
    ).all()
    return [event_from_row(r) for r in rows]


async def turn_events(conn: AsyncConnection, *, turn_id: uuid.UUID) -> list[EventRecord]:
    rows = (await conn.execute(_TURN_EVENTS, {"turn_id": turn_id})).all()
    return [event_from_row(r) for r in rows]


async def session_seqs(
    conn: AsyncConnection, *, session_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, int]:
    rows = (await conn.execute(_SEQS, {"ids": list(session_ids)})).all()
    return {r.id: int(r.event_seq) for r in rows}
