"""Reads of the record, and the one plain insert (a new session)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

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
# The first page and the pages after a cursor are two statements: the
# requests' pool keeps generic plans (keyturn.db.engine), and in one
# statement with "no cursor, or after it" the cursor could not bound the
# index scan, so a page at the end of the list read every session before it.
_FIRST_SESSIONS = Statement(
    f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE tenant = :tenant "
    "ORDER BY created_at, id LIMIT :limit"
)
_SESSIONS_AFTER = Statement(
    f"SELECT {_SESSION_COLUMNS} FROM sessions "
    "WHERE tenant = :tenant AND (created_at, id) > (:after_ts, :after_id) "
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
# The rows of a UNION name each column's type in its first branch: a NULL
# there is cast to the type the other branch gives (a column added to the
# table and not named here fails at import).
_RAW_EVENT_TYPES = {
    "id": "bigint",
    "session_id": "uuid",
    "turn_id": "uuid",
    "seq": "bigint",
    "type": "text",
    "data": "text",
    "created_at": "timestamptz",
}
_NULL_EVENT = ", ".join(
    f"CAST(NULL AS {_RAW_EVENT_TYPES[name]}) AS {name}" for name in _EVENT_COLUMNS.split(", ")
)
_NULL_SESSION = ", ".join("NULL" for _ in _SESSION_COLUMNS.split(", "))
_RAW_EVENTS_AFTER = Statement(
    f"SELECT {_RAW_EVENT_COLUMNS} FROM events WHERE session_id = :session_id AND seq > :after "
    "ORDER BY seq LIMIT :limit"
)
_RAW_EVENTS_BEFORE = Statement(
    f"SELECT {_RAW_EVENT_COLUMNS} FROM events WHERE session_id = :session_id AND seq < :before "
    "ORDER BY seq DESC LIMIT :limit"
)


# A session and the first page of its events after a seq, in one round trip
# (a page read otherwise costs two: the session under its tenant, then its
# events): the session's row (its columns prefixed, the event's NULL), then
# one row per event (the session's columns NULL, not repeated on each).
def _session_with_events(event_columns: str) -> Statement:
    return Statement(
        f"WITH s AS (SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = :id AND tenant = :tenant) "
        f"(SELECT {columns(Session, alias='s', prefix='s_')}, {_NULL_EVENT} FROM s) UNION ALL "
        f"(SELECT {_NULL_SESSION}, {event_columns} FROM events "
        "WHERE session_id = (SELECT id FROM s) AND seq > :after ORDER BY seq LIMIT :limit)"
    )


_SESSION_WITH_EVENTS = _session_with_events(_RAW_EVENT_COLUMNS)
# The same for a page whose answer reads only each event's seq, type and
# data: its id, turn and time are not decoded (a page's rows cost half as
# much to read), and its session is the one in the first row.
_LEAN_EVENT_COLUMNS = ", ".join(
    "CAST(data AS text) AS data"
    if name == "data"
    else name
    if name in ("seq", "type")
    else f"NULL AS {name}"
    for name in _EVENT_COLUMNS.split(", ")
)
_SESSION_WITH_LEAN_EVENTS = _session_with_events(_LEAN_EVENT_COLUMNS)
# Where a lean row's seq, type and data stand: after the session's columns.
_LEAN_AT = tuple(
    len(_SESSION_COLUMNS.split(", ")) + _EVENT_COLUMNS.split(", ").index(name)
    for name in ("seq", "type", "data")
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
# What the tool ledger (keyturn.runtime.ledger.tool_calls) reads of a page of
# turns, for Turn.toolCalls: their tool.* events only. A streamed turn's
# turn.delta pieces (thousands of them) are filtered in the database, never
# sent, decoded and dropped here.
_TOOL_EVENTS_OF_TURNS = Statement(
    f"SELECT {_EVENT_COLUMNS} FROM events WHERE turn_id = ANY(:ids) AND type LIKE 'tool.%' "
    "ORDER BY turn_id, seq"
)
# A page of events per session, for a page of sessions: the window of
# _RAW_EVENTS_AFTER/_RAW_EVENTS_BEFORE taken per session (each one an ordered
# range of the session's seq index). A session with no events has no row: its
# count is its own event_seq, already read with it.
_EVENT_PAGES = (
    "SELECT e.* FROM unnest(CAST(:ids AS uuid[])) AS s(id) "
    f"CROSS JOIN LATERAL (SELECT {_RAW_EVENT_COLUMNS} FROM events "
    "WHERE session_id = s.id AND {window} ORDER BY {order} LIMIT :limit) e "
    "ORDER BY e.session_id, e.{order}"
)
_RAW_EVENTS_AFTER_BATCH = Statement(_EVENT_PAGES.format(window="seq > :after", order="seq"))
_RAW_EVENTS_BEFORE_BATCH = Statement(_EVENT_PAGES.format(window="seq < :before", order="seq DESC"))
# A turn's events from seq ``after`` on, for a page of turns (Turn.events
# with first/afterSeq): one ordered range of the turn's index per turn.
_TURN_EVENT_PAGES = Statement(
    "SELECT e.* FROM unnest(CAST(:ids AS uuid[])) AS t(id) "
    f"CROSS JOIN LATERAL (SELECT {_EVENT_COLUMNS} FROM events "
    "WHERE turn_id = t.id AND seq > :after ORDER BY seq LIMIT :limit) e "
    "ORDER BY e.turn_id, e.seq"
)
# Query.nodes: every id of one kind in one statement, under the caller's tenant.
_SESSIONS_BY_ID = Statement(
    f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ANY(:ids) AND tenant = :tenant"
)
_TURNS_BY_ID = Statement(
    f"SELECT {columns(Turn, alias='t')} FROM turns t JOIN sessions s ON s.id = t.session_id "
    "WHERE t.id = ANY(:ids) AND s.tenant = :tenant"
)
_EVENTS_BY_ID = Statement(
    f"SELECT {columns(Event, alias='e')} FROM events e JOIN sessions s ON s.id = e.session_id "
    "WHERE e.id = ANY(CAST(:ids AS bigint[])) AND s.tenant = :tenant"
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


async def session_with_events(
    conn: Conn,
    *,
    tenant: str,
    session_id: uuid.UUID,
    after: int,
    limit: int,
    lean: bool = False,
) -> tuple[SessionRecord | None, list[EventRecord]]:
    """The session (None if the tenant has none of that id) and at most
    ``limit`` of its events after seq ``after``, read at one snapshot, their
    data as :func:`events_after` reads it with ``raw_data``. With ``lean``,
    for an answer that reads nothing of an event but its seq, type and data,
    the events' id, turn id and time are not read: they are None."""
    statement = _SESSION_WITH_LEAN_EVENTS if lean else _SESSION_WITH_EVENTS
    rows = await statement.fetch(conn, id=session_id, tenant=tenant, after=after, limit=limit)
    if not rows:
        return None, []
    if rows[0]["s_id"] is None:
        # PostgreSQL appends a UNION ALL's branches in order; SQL does not
        # promise it. A stable sort keeps the events in theirs.
        rows = sorted(rows, key=lambda r: r["s_id"] is None)
    found = session_from(rows[0], prefix="s_")
    if lean:
        # By position: a page's hundred rows, each column looked up by name, cost more.
        sid, (seq, kind, data) = found.id, _LEAN_AT
        records: list[Any] = rows[1:]  # asyncpg's records: indexed by position too
        lean_events = [
            EventRecord(None, sid, None, r[seq], r[kind], RawJSON(r[data]), None)  # type: ignore[arg-type]
            for r in records
        ]
        return found, lean_events
    return found, [_raw_event(r) for r in rows[1:]]


async def sessions_after(
    conn: Conn, *, tenant: str, after: tuple[datetime, uuid.UUID] | None, limit: int
) -> list[SessionRecord]:
    if after is None:
        rows = await _FIRST_SESSIONS.fetch(conn, tenant=tenant, limit=limit)
    else:
        rows = await _SESSIONS_AFTER.fetch(
            conn, tenant=tenant, after_ts=after[0], after_id=after[1], limit=limit
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
    # The data is read by the answer's encoder only. Not typing.cast: a call
    # per event, where a page has a hundred.
    return EventRecord(
        row["id"],
        row["session_id"],
        row["turn_id"],
        row["seq"],
        row["type"],
        RawJSON(row["data"]),  # type: ignore[arg-type]
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


async def tool_events_of_turns(
    conn: Conn, *, turn_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[EventRecord]]:
    """Each turn's ``tool.*`` events, all the tool ledger reads, in seq order
    (a turn with none maps to an empty list)."""
    ids = list(dict.fromkeys(turn_ids))
    found: dict[uuid.UUID, list[EventRecord]] = {tid: [] for tid in ids}
    for r in await _TOOL_EVENTS_OF_TURNS.fetch(conn, ids=ids):
        found[r["turn_id"]].append(event_from(r))
    return found


async def turn_event_pages(
    conn: Conn, *, turn_ids: Sequence[uuid.UUID], after: int, limit: int
) -> dict[uuid.UUID, list[EventRecord]]:
    """Per turn: up to ``limit`` of its events with seq above ``after``, in seq order."""
    ids = list(dict.fromkeys(turn_ids))
    found: dict[uuid.UUID, list[EventRecord]] = {tid: [] for tid in ids}
    for r in await _TURN_EVENT_PAGES.fetch(conn, ids=ids, after=after, limit=limit):
        found[r["turn_id"]].append(event_from(r))
    return found


def _event_pages(
    rows: Sequence[Row], session_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[EventRecord]]:
    found: dict[uuid.UUID, list[EventRecord]] = {sid: [] for sid in session_ids}
    for r in rows:
        found[r["session_id"]].append(_raw_event(r))
    return found


async def events_after_batch(
    conn: Conn, *, session_ids: Sequence[uuid.UUID], after: int, limit: int
) -> dict[uuid.UUID, list[EventRecord]]:
    """Per session: ``events_after`` with ``raw_data``, for all of them in one statement."""
    ids = list(dict.fromkeys(session_ids))
    rows = await _RAW_EVENTS_AFTER_BATCH.fetch(conn, ids=ids, after=after, limit=limit)
    return _event_pages(rows, ids)


async def events_before_batch(
    conn: Conn, *, session_ids: Sequence[uuid.UUID], before: int, limit: int
) -> dict[uuid.UUID, list[EventRecord]]:
    """Per session: ``events_before`` with ``raw_data`` (latest first), in one statement."""
    ids = list(dict.fromkeys(session_ids))
    rows = await _RAW_EVENTS_BEFORE_BATCH.fetch(conn, ids=ids, before=before, limit=limit)
    return _event_pages(rows, ids)


async def sessions_by_id(
    conn: Conn, *, tenant: str, session_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, SessionRecord]:
    """The tenant's sessions among ``session_ids`` (others are absent)."""
    rows = await _SESSIONS_BY_ID.fetch(conn, ids=list(session_ids), tenant=tenant)
    return {r["id"]: session_from(r) for r in rows}


async def turns_by_id(
    conn: Conn, *, tenant: str, turn_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, TurnRecord]:
    """The tenant's turns among ``turn_ids`` (others are absent)."""
    rows = await _TURNS_BY_ID.fetch(conn, ids=list(turn_ids), tenant=tenant)
    return {r["id"]: turn_from(r) for r in rows}


async def events_by_id(
    conn: Conn, *, tenant: str, event_ids: Sequence[int]
) -> dict[int, EventRecord]:
    """The tenant's events among ``event_ids`` (others are absent)."""
    rows = await _EVENTS_BY_ID.fetch(conn, ids=list(event_ids), tenant=tenant)
    return {r["id"]: event_from(r) for r in rows}


async def session_seqs(conn: Conn, *, session_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    rows = await _SEQS.fetch(conn, ids=list(session_ids))
    return {r["id"]: int(r["event_seq"]) for r in rows}
