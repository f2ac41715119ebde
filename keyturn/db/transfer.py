"""The SQL of moving a session between Keyturns (``keyturn export`` and
``keyturn import``; the file format is :mod:`keyturn.ops.transfer`'s).

A session travels as its rows: the session, its turns (keys and
fingerprints included), its events (the tool ledger is events), its
resolutions, the tombstones of its pruned turns, and its keys
(``session_keys``: the one namespace of every key its requests took, which
alone still holds the keys that cancelled or decided a pruned turn).
Values are encoded for JSON by their column's type, as declared in
:mod:`keyturn.db.tables`, and decoded the same way, so a file holds exactly
the columns of each table and nothing else.

Export reads one snapshot (REPEATABLE READ, read only) of one session or of
every session of a tenant, through server-side cursors; import writes in
batches inside the caller's one transaction.
An event's ``id`` is the only value not carried: it numbers events across
all sessions of one database, so the importing database numbers them anew;
within its session an event is its ``seq``, which is kept.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson
from sqlalchemy import BigInteger, Boolean, DateTime, Uuid
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import SQLModel

from keyturn.db.engine import Conn
from keyturn.db.failures import DRIVER_ERRORS
from keyturn.db.sql import Statement, literal
from keyturn.db.tables import Event, KeyTombstone, Resolution, Session, SessionKey, Turn
from keyturn.domain import TurnStatus
from keyturn.errors import TransferRefused

Record = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Part:
    """One table's share of a session: its name in the file, its columns as
    carried, the column that names a row within the session, and its order.
    A column is its field in the file, but for one named like a field every
    line has (``kind``), which is carried under another name."""

    kind: str
    table: type[SQLModel]
    columns: tuple[str, ...]
    key: str
    session_column: str
    order: str
    renamed: tuple[tuple[str, str], ...] = ()  # (column, its field in the file)

    @property
    def name(self) -> str:
        return str(self.table.__tablename__)

    def field(self, column: str) -> str:
        return dict(self.renamed).get(column, column)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.field(c) for c in self.columns)

    def column_types(self) -> dict[str, Any]:
        cols = self.table.__table__.columns  # type: ignore[attr-defined]
        return {c.name: c.type for c in cols if c.name in self.columns}


def _part(
    kind: str,
    table: type[SQLModel],
    *,
    key: str,
    order: str,
    session_column: str = "session_id",
    leave_out: tuple[str, ...] = (),
) -> Part:
    names = tuple(
        c.name
        for c in table.__table__.columns  # type: ignore[attr-defined]
        if c.name not in leave_out
    )
    renamed = (("kind", f"{kind}_kind"),) if "kind" in names else ()
    return Part(kind, table, names, key, session_column, order, renamed)


SESSION = _part("session", Session, key="id", order="id", session_column="id")
# In the file's order: each part's rows refer only to rows of parts before it.
PARTS = (
    _part("turn", Turn, key="id", order="admit_seq"),
    _part("event", Event, key="seq", order="seq", leave_out=("id",)),
    _part("resolution", Resolution, key="id", order="created_at, id"),
    _part("tombstone", KeyTombstone, key="idempotency_key", order="idempotency_key"),
    _part("key", SessionKey, key="idempotency_key", order="idempotency_key"),
)
# The file format version that first carried each part; an older file's
# session lacks it (its keys are rebuilt from its record instead).
_CARRIED_SINCE = {"key": 2}


def parts(version: int) -> tuple[Part, ...]:
    """The parts a file of ``version`` carries, in the file's order."""
    return tuple(p for p in PARTS if _CARRIED_SINCE.get(p.kind, 1) <= version)


# Fields a file of the same version may lack, written before their columns
# existed (migration 0010), and the value such a row had: it was never
# cancelled, and its session enqueued.
_ADDED_SINCE: dict[str, Record] = {
    "turn": {
        "cancel_requested_at": None,
        "cancel_reason": None,
        "cancel_key": None,
        "cancel_fingerprint": None,
    },
    "session": {"multitask": "ENQUEUE"},
}


# -- values ---------------------------------------------------------------------
def encode(part: Part, row: Any) -> Record:
    """A row as JSON takes it: ids and times as strings, data as it is."""
    out: Record = {}
    for name, kind in part.column_types().items():
        value = row[name]
        field = part.field(name)
        if value is None:
            out[field] = None
        elif isinstance(kind, Uuid):
            out[field] = str(value)
        elif isinstance(kind, DateTime):
            out[field] = value.astimezone(UTC).isoformat()
        else:
            out[field] = value
    return out


def decode(part: Part, raw: Any) -> Record:
    """A record of the file as the table takes it; TransferRefused naming the
    field when it is not one of this table's rows."""
    if not isinstance(raw, dict):
        raise TransferRefused(f"a {part.kind} must be a JSON object")
    raw = {**_ADDED_SINCE.get(part.kind, {}), **raw}
    given = set(raw) - {"kind"}
    expected = set(part.fields)
    if given != expected:
        odd = sorted(given - expected) or sorted(expected - given)
        raise TransferRefused(
            f"a {part.kind} has exactly the fields {', '.join(part.fields)} (not so for {odd[0]!r})"
        )
    out: Record = {}
    for name, kind in part.column_types().items():
        out[name] = _value(part, name, kind, raw[part.field(name)])
    return out


def _value(part: Part, name: str, kind: Any, value: Any) -> Any:
    column = part.table.__table__.columns[name]  # type: ignore[attr-defined]
    field = part.field(name)
    if value is None:
        if not column.nullable:
            raise TransferRefused(f"{part.kind} field {field!r} must not be null")
        return None
    try:
        if isinstance(kind, Uuid):
            return uuid.UUID(_text(value))
        if isinstance(kind, DateTime):
            when = datetime.fromisoformat(_text(value))
            if when.tzinfo is None:
                raise ValueError("no time zone")
            return when
        if isinstance(kind, JSONB):
            if not isinstance(value, dict):
                raise ValueError("not an object")
            return value
        if isinstance(kind, Boolean):
            if not isinstance(value, bool):
                raise ValueError("not true or false")
            return value
        if isinstance(kind, BigInteger):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError("not an integer")
            return value
        return _text(value)
    except ValueError as error:
        raise TransferRefused(f"{part.kind} field {field!r} is not valid ({error})") from None


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("not a string")
    if "\x00" in value:
        raise ValueError("contains NUL")
    return value


def canonical(part: Part, record: Record) -> Record:
    """A decoded record as :func:`encode` writes it: two records are the same
    row exactly when their canonical forms are equal."""
    return encode(part, record)


# -- export -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Scope:
    """What an export takes, as one snapshot sees it."""

    sessions: int
    counts: dict[str, int]  # rows per part kind, over all its sessions
    running: tuple[uuid.UUID, uuid.UUID] | None  # (session, turn) of a RUNNING turn


# The sessions of ``:tenant``, or its one session ``:session_id`` when that is
# not NULL, oldest first (along ix_sessions_tenant_created).
_IN_SCOPE = """
    SELECT s.id FROM sessions s
    WHERE s.tenant = :tenant
      AND (CAST(:session_id AS uuid) IS NULL OR s.id = CAST(:session_id AS uuid))"""
_SESSIONS = Statement(
    f"""
    SELECT {", ".join(f"s.{c}" for c in SESSION.columns)} FROM sessions s
    WHERE s.id IN ({_IN_SCOPE}) ORDER BY s.created_at, s.id
    """
)
_SCOPE = Statement(
    f"SELECT (SELECT count(*) FROM ({_IN_SCOPE}) x) AS sessions, "
    + ", ".join(
        f"(SELECT count(*) FROM {p.name} WHERE {p.session_column} IN ({_IN_SCOPE})) AS {p.kind}"
        for p in PARTS
    )
)
_RUNNING = Statement(
    f"""
    SELECT session_id, id FROM turns
    WHERE session_id IN ({_IN_SCOPE}) AND status = {literal(TurnStatus.RUNNING)}
    ORDER BY session_id LIMIT 1
    """
)
_COUNTS = Statement(
    "SELECT "
    + ", ".join(
        f"(SELECT count(*) FROM {p.name} WHERE {p.session_column} = :id) AS {p.kind}" for p in PARTS
    )
)
_ROWS = {
    p.kind: Statement(
        f"SELECT {', '.join(p.columns)} FROM {p.name} WHERE {p.session_column} = :id "
        f"ORDER BY {p.order}"
    )
    for p in PARTS
}


@asynccontextmanager
async def one_snapshot(conn: Conn) -> AsyncIterator[None]:
    """Every read inside sees the record at one moment, and writes nothing."""
    async with conn.driver.transaction(isolation="repeatable_read", readonly=True):
        yield


async def scope(conn: Conn, *, tenant: str, session_id: uuid.UUID | None) -> Scope:
    """Inside :func:`one_snapshot`: how many sessions and rows an export of
    the tenant (or of its one session) takes, and a turn that runs."""
    row = await _SCOPE.fetchrow(conn, tenant=tenant, session_id=session_id)
    assert row is not None  # a SELECT of scalar subqueries has its one row
    running = await _RUNNING.fetchrow(conn, tenant=tenant, session_id=session_id)
    return Scope(
        sessions=int(row["sessions"]),
        counts={p.kind: int(row[p.kind]) for p in PARTS},
        running=(running["session_id"], running["id"]) if running is not None else None,
    )


async def sessions(
    conn: Conn, *, tenant: str, session_id: uuid.UUID | None
) -> AsyncIterator[Record]:
    """Inside :func:`one_snapshot`: the sessions of :func:`scope`, encoded,
    oldest first, through a server-side cursor."""
    async for row in _SESSIONS.cursor(conn, tenant=tenant, session_id=session_id):
        yield encode(SESSION, row)


async def rows(conn: Conn, part: Part, *, session_id: uuid.UUID) -> AsyncIterator[Record]:
    """Inside :func:`one_snapshot`: the part's rows of the session, encoded,
    through a server-side cursor."""
    async for row in _ROWS[part.kind].cursor(conn, id=session_id):
        yield encode(part, row)


# -- import -----------------------------------------------------------------------
def _insert(part: Part) -> Statement:
    types = part.column_types()
    values = ", ".join(
        f"CAST(:{n} AS jsonb)" if isinstance(types[n], JSONB) else f":{n}" for n in part.columns
    )
    return Statement(f"INSERT INTO {part.name} ({', '.join(part.columns)}) VALUES ({values})")


def _params(part: Part, record: Record) -> Record:
    types = part.column_types()
    return {
        n: orjson.dumps(v).decode() if isinstance(types[n], JSONB) and v is not None else v
        for n, v in record.items()
    }


_INSERTS = {p.kind: _insert(p) for p in (SESSION, *PARTS)}
_LOCK_SESSION = Statement(
    f"SELECT {', '.join(SESSION.columns)} FROM sessions WHERE id = :id FOR UPDATE"
)
_BY_KEYS = {
    p.kind: Statement(
        f"SELECT {', '.join(p.columns)} FROM {p.name} "
        f"WHERE {p.session_column} = :session_id AND {p.key} = ANY(:keys)"
    )
    for p in PARTS
}
# Rows whose id is taken anywhere in this database (turn and resolution ids are global).
_TAKEN = {
    p.kind: Statement(f"SELECT {p.key} FROM {p.name} WHERE {p.key} = ANY(:keys) LIMIT 1")
    for p in PARTS
    if p.key == "id"
}
# What must hold of an imported session before it commits: seq gapless up to
# the counter, every reference inside the session, no turn left RUNNING.
_CHECK = Statement(
    f"""
    SELECT
      (SELECT count(*) FROM events WHERE session_id = :id) AS events,
      (SELECT coalesce(max(seq), 0) FROM events WHERE session_id = :id) AS last_seq,
      (SELECT count(*) FROM events e JOIN turns t ON t.id = e.turn_id
       WHERE e.session_id = :id AND t.session_id <> :id)
      + (SELECT count(*) FROM resolutions r JOIN turns t ON t.id IN (r.turn_id, r.new_turn_id)
         WHERE r.session_id = :id AND t.session_id <> :id)
      + (SELECT count(*) FROM turns r JOIN turns t ON t.id = r.retry_of
         WHERE r.session_id = :id AND t.session_id <> :id) AS outside,
      (SELECT count(*) FROM turns
       WHERE session_id = :id AND status = {literal(TurnStatus.RUNNING)}) AS running
    """
)


def _refused_by(error: BaseException, what: str) -> TransferRefused:
    name = getattr(error, "constraint_name", None) or type(error).__name__
    return TransferRefused(f"{what} is refused by this database ({name})")


async def lock_session(conn: Conn, *, session_id: uuid.UUID) -> Record | None:
    """Inside the import's transaction: the session here, if any (encoded),
    locked so that nothing is admitted to it while it is compared."""
    row = await _LOCK_SESSION.fetchrow(conn, id=session_id)
    return encode(SESSION, row) if row is not None else None


async def insert(conn: Conn, part: Part, records: Sequence[Record]) -> None:
    """Decoded records of one part; TransferRefused when one of their ids is
    taken here by another session, or a rule of the tables refuses them."""
    if part.kind in _TAKEN:
        taken = await _TAKEN[part.kind].fetchval(conn, keys=[r[part.key] for r in records])
        if taken is not None:
            raise TransferRefused(f"{part.kind} {taken} already exists here, in another session")
    try:
        await _INSERTS[part.kind].executemany(conn, [_params(part, r) for r in records])
    except (asyncpg.IntegrityConstraintViolationError, asyncpg.DataError) as error:
        raise _refused_by(error, f"a {part.kind} of the file") from None


async def differing(
    conn: Conn, part: Part, *, session_id: uuid.UUID, records: Sequence[Record]
) -> str | None:
    """How the first of ``records`` (decoded) differs from the row here, or None."""
    found = await _BY_KEYS[part.kind].fetch(
        conn, session_id=session_id, keys=[r[part.key] for r in records]
    )
    here = {str(row[part.key]): encode(part, row) for row in found}
    for record in records:
        mine = canonical(part, record)
        theirs = here.get(str(record[part.key]))
        if theirs is None:
            return f"{part.kind} {record[part.key]} is not in the session here"
        for name in part.fields:
            if mine[name] != theirs[name]:
                return f"{part.kind} {record[part.key]} differs here ({name})"
    return None


async def insert_session(conn: Conn, record: Record) -> None:
    try:
        await _INSERTS[SESSION.kind].execute(conn, **_params(SESSION, record))
    except DRIVER_ERRORS as error:
        if isinstance(error, asyncpg.UniqueViolationError):
            raise TransferRefused(
                f"session {record['id']} was created here meanwhile; run the import again"
            ) from None
        if isinstance(error, asyncpg.IntegrityConstraintViolationError | asyncpg.DataError):
            raise _refused_by(error, "the file's session") from None
        raise


async def counts(
    conn: Conn, *, session_id: uuid.UUID, of: Sequence[Part] = PARTS
) -> dict[str, int]:
    """The session's rows here, per part of ``of``."""
    row = await _COUNTS.fetchrow(conn, id=session_id)
    assert row is not None
    return {p.kind: int(row[p.kind]) for p in of}


async def check_imported(conn: Conn, *, session_id: uuid.UUID, event_seq: int) -> str | None:
    """What is wrong with the session just written (before commit), or None."""
    row = await _CHECK.fetchrow(conn, id=session_id)
    assert row is not None
    if row["running"]:
        return "a turn of the file is RUNNING (export a session once its turn has ended)"
    if row["outside"]:
        return "the file's rows refer to turns outside the session"
    if row["events"] != event_seq or row["last_seq"] != event_seq:
        return f"the session's counter is {event_seq} but its events are not seq 1 to {event_seq}"
    return None
