"""Reads of the record, and the one plain insert (a new session)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from keyturn.db.engine import Conn
from keyturn.db.records import (
    EventRecord,
    Row,
    SessionRecord,
    TurnRecord,
    event_from,
    session_from,
    turn_from,
)
from keyturn.db.sql import Statement, columns
from keyturn.db.tables import Event, Session, Turn
from keyturn.domain import History, Multitask

_SESSION_COLUMNS = columns(Session)
_EVENT_COLUMNS = columns(Event)

# Every lookup a client can cause names the tenant: another tenant's session,
# turn or events read exactly as "not found".
_CREATE_SESSION = Statement(
    "INSERT INTO sessions (id, tenant, default_history, multitask) "
    "VALUES (:id, :tenant, :default_history, :multitask) "
    f"RETURNING {_SESSION_COLUMNS}"
)
_SESSION = Statement(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = :id AND tenant = :tenant")
_SESSIONS_AFTER = Statement(
    f"SELECT {_SESSION_COLUMNS} FROM sessions "
    "WHERE tenant = :tenant AND (CAST(:after_ts AS timestamptz) IS NULL "
    "OR (created_at, id) > (:after_ts, :after_id)) "
    "ORDER BY created_at, id LIMIT :limit"
)
_SESSION_COUNT = Statement("SELECT count(*) FROM sessions WHERE tenant = :tenant")
_TURN = Statement(
    f"SELECT {columns(Turn, alias='t')} "
    "FROM turns t JOIN sessions s ON s.id = t.session_id WHERE t.id = :id AND s.tenant = :tenant"
)
_TURNS_AFTER = Statement(
    f"SELECT {columns(Turn)} FROM turns WHERE session_id = :session_id AND admit_seq > :after "
    "ORDER BY admit_seq LIMIT :limit"
)
_TURNS_BEFORE = Statement(
    f"SELECT {columns(Turn)} FROM turns WHERE session_id = :session_id AND admit_seq < :before "
    "ORDER BY admit_seq DESC LIMIT :limit"
)
_TURN_COUNT = Statement("SELECT count(*) FROM turns WHERE session_id = :session_id")
_EVENTS_AFTER = Statement(
    f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_id = :session_id AND seq > :after "
    "ORDER BY seq LIMIT :limit"
)
_EVENTS_BEFORE = Statement(
    f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_id = :session_id AND seq < :before "
    "ORDER BY seq DESC LIMIT :limit"
)
# The same pages with ``data`` as the text PostgreSQL keeps (raw_data=True).
_RAW_EVENT_COLUMNS = ", ".join(
    "CAST(data AS text) AS data" if name == "data" else name for name in _EVENT_COLUMNS.split(", ")
)
_RAW_EVENTS_AFTER = Statement(
    f"SELECT {_RAW_EVENT_COLUMNS} FROM events WHERE session_id = :session_id AND seq > :after "
    "ORDER BY seq LIMIT :limit"
)
_RAW_EVENTS_BEFORE = Statement(
    f"SELECT {_RAW_EVENT_COLUMNS} FROM events WHERE session_id = :session_id AND seq < :before "
    "ORDER BY seq DESC LIMIT :limit"
)
_EVENT = Statement(
    f"SELECT {columns(Event, alias='e')} FROM events e JOIN sessions s ON s.id = e.session_id "
    "WHERE e.id = :id AND s.tenant = :tenant"
)
_TURN_EVENTS = Statement(
    f"SELECT {_EVENT_COLUMNS} FROM events WHERE turn_id = :turn_id ORDER BY seq"
)
# One snapshot for both: if the turn is not terminal here, its terminal event
# will carry a seq above this session's counter.
_TURN_AND_SEQ = Statement(
    f"SELECT {columns(Turn, alias='t')}, s.event_seq AS session_event_seq "
    "FROM turns t JOIN sessions s ON s.id = t.session_id WHERE t.id = :id AND s.tenant = :tenant"
)
_SEQS = Statement("SELECT id, event_seq FROM sessions WHERE id = ANY(:ids)")

# Batches: one statement answers for many sessions or turns at once (a page
# of sessions with their turns, a page of turns with their events, is a
# handful of statements, not one per row). Each page is the same window the
# single-session statements above read, taken per session by a LATERAL join;
# a session with no turns still yields its row (and its count of 0).
_TURN_PAGE_COLUMNS = columns(Turn, alias="t")
_BATCH_PAGE = (
    "SELECT s.id AS page_session, c.n AS page_total, {turn} "
    "FROM unnest(CAST(:ids AS uuid[])) AS s(id) "
    "CROSS JOIN LATERAL (SELECT count(*) AS n FROM turns WHERE session_id = s.id) c "
    "LEFT JOIN LATERAL (SELECT * FROM turns WHERE session_id = s.id AND {window} "
    "ORDER BY {order} LIMIT :limit) t ON true "
    # A join's rows come in no promised order: the page's order is restated.
    "ORDER BY s.id, t.{order}"
)
_TURNS_AFTER_BATCH = Statement(
    _BATCH_PAGE.format(turn=_TURN_PAGE_COLUMNS, window="admit_seq > :after", order="admit_seq")
)
_TURNS_BEFORE_BATCH = Statement(
    _BATCH_PAGE.format(
        turn=_TURN_PAGE_COLUMNS, window="admit_seq < :before", order="admit_seq DESC"
    )
)
_EVENTS_OF_TURNS = Statement(
    f"SELECT {_EVENT_COLUMNS} FROM events WHERE turn_id = ANY(:ids) ORDER BY turn_id, seq"
)


async def create_session(
    conn: Conn,
    *,
    tenant: str,
    default_history: History,
    multitask: Multitask = Multitask.ENQUEUE,
) -> SessionRecord:
    row = await _CREATE_SESSION.fetchrow(
        conn, id=uuid.uuid4(), tenant=tenant, default_history=default_history, multitask=multitask
    )
    assert row is not None  # an INSERT … RETURNING without a condition returns its row
    return session_from(row)


async def session(conn: Conn, *, tenant: str, session_id: uuid.UUID) -> SessionRecord | None:
    row = await _SESSION.fetchrow(conn, id=session_id, tenant=tenant)
    return session_from(row) if row is not None else None


async def sessions_after(
    conn: Conn, *, tenant: str, after: tuple[datetime, uuid.UUID] | None, limit: int
) -> list[SessionRecord]:
    after_ts, after_id = after if after is not None else (None, None)
    rows = await _SESSIONS_AFTER.fetch(
        conn, tenant=tenant, after_ts=after_ts, after_id=after_id, limit=limit
    )
    return [session_from(r) for r in rows]


async def session_count(conn: Conn, *, tenant: str) -> int:
    return int(await _SESSION_COUNT.fetchval(conn, tenant=tenant))


async def turn(conn: Conn, *, tenant: str, turn_id: uuid.UUID) -> TurnRecord | None:
    row = await _TURN.fetchrow(conn, id=turn_id, tenant=tenant)
    return turn_from(row) if row is not None else None


async def turn_with_session_seq(
    conn: Conn, *, tenant: str, turn_id: uuid.UUID
) -> tuple[TurnRecord, int] | None:
    row = await _TURN_AND_SEQ.fetchrow(conn, id=turn_id, tenant=tenant)
    if row is None:
        return None
    return turn_from(row), int(row["session_event_seq"])


async def turns_after(
    conn: Conn, *, session_id: uuid.UUID, after: int, limit: int
) -> list[TurnRecord]:
    rows = await _TURNS_AFTER.fetch(conn, session_id=session_id, after=after, limit=limit)
    return [turn_from(r) for r in rows]


async def turns_before(
    conn: Conn, *, session_id: uuid.UUID, before: int, limit: int
) -> list[TurnRecord]:
    """The ``limit`` turns admitted just before ``before``, latest first."""
    rows = await _TURNS_BEFORE.fetch(conn, session_id=session_id, before=before, limit=limit)
    return [turn_from(r) for r in rows]


async def turn_count(conn: Conn, *, session_id: uuid.UUID) -> int:
    return int(await _TURN_COUNT.fetchval(conn, session_id=session_id))


class RawJSON:
    """JSON text as PostgreSQL gave it, for an answer to pass on unparsed:
    the answer's encoder writes it in place (keyturn.http.app), rather than
    the data being decoded here only to be encoded again there."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _raw_event(row: Row) -> EventRecord:
    data = cast(dict[str, Any], RawJSON(row["data"]))  # read by the answer's encoder only
    return EventRecord(
        row["id"],
        row["session_id"],
        row["turn_id"],
        row["seq"],
        row["type"],
        data,
        row["created_at"],
    )


async def events_after(
    conn: Conn, *, session_id: uuid.UUID, after: int, limit: int, raw_data: bool = False
) -> list[EventRecord]:
    """With ``raw_data`` each event's data is its JSON text (:class:`RawJSON`),
    for an answer that only passes it on."""
    if raw_data:
        rows = await _RAW_EVENTS_AFTER.fetch(conn, session_id=session_id, after=after, limit=limit)
        return [_raw_event(r) for r in rows]
    rows = await _EVENTS_AFTER.fetch(conn, session_id=session_id, after=after, limit=limit)
    return [event_from(r) for r in rows]


async def events_before(
    conn: Conn, *, session_id: uuid.UUID, before: int, limit: int, raw_data: bool = False
) -> list[EventRecord]:
    """The ``limit`` events just before seq ``before``, latest first
    (``raw_data`` as for :func:`events_after`)."""
    statement = _RAW_EVENTS_BEFORE if raw_data else _EVENTS_BEFORE
    rows = await statement.fetch(conn, session_id=session_id, before=before, limit=limit)
    return [_raw_event(r) if raw_data else event_from(r) for r in rows]


async def event(conn: Conn, *, tenant: str, event_id: int) -> EventRecord | None:
    row = await _EVENT.fetchrow(conn, id=event_id, tenant=tenant)
    return event_from(row) if row is not None else None


async def turn_events(conn: Conn, *, turn_id: uuid.UUID) -> list[EventRecord]:
    return [event_from(r) for r in await _TURN_EVENTS.fetch(conn, turn_id=turn_id)]


def _pages(
    rows: Sequence[Row], session_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, tuple[list[TurnRecord], int]]:
    pages: dict[uuid.UUID, tuple[list[TurnRecord], int]] = {}
    for r in rows:
        page, _ = pages.setdefault(r["page_session"], ([], int(r["page_total"])))
        if r["id"] is not None:  # the outer join's row for a session with no turns
            page.append(turn_from(r))
    return {sid: pages.get(sid, ([], 0)) for sid in session_ids}


async def turns_after_batch(
    conn: Conn, *, session_ids: Sequence[uuid.UUID], after: int, limit: int
) -> dict[uuid.UUID, tuple[list[TurnRecord], int]]:
    """Per session: ``turns_after`` and ``turn_count``, for all of them in one statement."""
    ids = list(dict.fromkeys(session_ids))
    rows = await _TURNS_AFTER_BATCH.fetch(conn, ids=ids, after=after, limit=limit)
    return _pages(rows, ids)


async def turns_before_batch(
    conn: Conn, *, session_ids: Sequence[uuid.UUID], before: int, limit: int
) -> dict[uuid.UUID, tuple[list[TurnRecord], int]]:
    """Per session: ``turns_before`` (latest first) and ``turn_count``, in one statement."""
    ids = list(dict.fromkeys(session_ids))
    rows = await _TURNS_BEFORE_BATCH.fetch(conn, ids=ids, before=before, limit=limit)
    return _pages(rows, ids)


async def events_of_turns(
    conn: Conn, *, turn_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[EventRecord]]:
    """Each turn's events in seq order (a turn with none maps to an empty list)."""
    ids = list(dict.fromkeys(turn_ids))
    found: dict[uuid.UUID, list[EventRecord]] = {tid: [] for tid in ids}
    for r in await _EVENTS_OF_TURNS.fetch(conn, ids=ids):
        found[r["turn_id"]].append(event_from(r))
    return found


async def session_seqs(conn: Conn, *, session_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    rows = await _SEQS.fetch(conn, ids=list(session_ids))
    return {r["id"]: int(r["event_seq"]) for r in rows}
