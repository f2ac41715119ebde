"""Rows as read: plain records built from driver rows, one class per table.

Reads hand these up to the runtime instead of SQLModel objects: building a
table model costs tens of microseconds (measured: ~37 µs per event, ~60 µs
per turn), and nothing above ``db`` needs the ORM. The tables in
:mod:`keyturn.db.tables` stay the source of truth: every SELECT list is
generated from them, and a unit test checks that each record has exactly its
table's columns.

They are not frozen, though nothing changes a record once it is built: a
frozen dataclass sets each field through ``object.__setattr__``, which made
building one six times dearer (measured: 3.1 µs against 0.5 µs for an
event's seven fields; a page of 100 events builds 100 of them).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from enum import Enum
from typing import Any, TypeVar

from keyturn.domain import History, Multitask, ResolutionAction, TurnStatus

Row = Mapping[str, Any]
E = TypeVar("E", bound=Enum)


@dataclass(slots=True)
class SessionRecord:
    id: uuid.UUID
    tenant: str
    created_at: datetime
    default_history: History
    # The last seq handed out; seq is gapless, so also the number of events.
    event_seq: int
    multitask: Multitask = Multitask.ENQUEUE


@dataclass(slots=True)
class TurnRecord:
    id: uuid.UUID
    session_id: uuid.UUID
    idempotency_key: str
    fingerprint: str
    input: str
    history: History
    status: TurnStatus
    output: str | None
    error: str | None
    admit_seq: int
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    owner: str | None
    lease_until: datetime | None
    epoch: int
    retry_of: uuid.UUID | None
    # Its cancel (cancelTurn, or a later submission's multitask INTERRUPT).
    cancel_requested_at: datetime | None = None
    cancel_reason: str | None = None
    cancel_key: str | None = None
    cancel_fingerprint: str | None = None


@dataclass(slots=True)
class EventRecord:
    id: int
    session_id: uuid.UUID
    turn_id: uuid.UUID | None
    seq: int
    type: str  # an EventType value; kept as read, since events are streamed in bulk
    data: dict[str, Any]
    created_at: datetime


@dataclass(slots=True)
class ResolutionRecord:
    id: uuid.UUID
    session_id: uuid.UUID
    turn_id: uuid.UUID
    idempotency_key: str
    fingerprint: str
    action: ResolutionAction
    force: bool
    new_turn_id: uuid.UUID | None
    created_at: datetime


def names(record: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(record))


_SESSION = names(SessionRecord)
_TURN = names(TurnRecord)
_EVENT = names(EventRecord)
_RESOLUTION = names(ResolutionRecord)


@functools.cache
def _columns(fields_: tuple[str, ...], prefix: str) -> tuple[str, ...]:
    return tuple(prefix + n for n in fields_)


def _member(enum: type[E], value: Any) -> E:
    """``enum(value)`` for a value read from a column: the member by a dict
    lookup (Enum's own call is a tenth of reading a turn), the call itself
    for anything else, so a value no member has still raises as it did."""
    found = enum._value2member_map_.get(value)
    return found if found is not None else enum(value)  # type: ignore[return-value]


_SESSION_HISTORY = _SESSION.index("default_history")
_SESSION_MULTITASK = _SESSION.index("multitask")
_TURN_HISTORY = _TURN.index("history")
_TURN_STATUS = _TURN.index("status")


def session_from(row: Row, prefix: str = "") -> SessionRecord:
    values = [row[c] for c in _columns(_SESSION, prefix)]
    values[_SESSION_HISTORY] = _member(History, values[_SESSION_HISTORY])
    values[_SESSION_MULTITASK] = _member(Multitask, values[_SESSION_MULTITASK])
    return SessionRecord(*values)


def turn_from(row: Row, prefix: str = "") -> TurnRecord:
    values = [row[c] for c in _columns(_TURN, prefix)]
    values[_TURN_HISTORY] = _member(History, values[_TURN_HISTORY])
    values[_TURN_STATUS] = _member(TurnStatus, values[_TURN_STATUS])
    return TurnRecord(*values)


def event_from(row: Row) -> EventRecord:
    return EventRecord(*(row[n] for n in _EVENT))


def resolution_from(row: Row, prefix: str = "") -> ResolutionRecord | None:
    """None when the row's resolution columns are NULL (an outer join found none)."""
    if row[prefix + "id"] is None:
        return None
    values = {n: row[prefix + n] for n in _RESOLUTION}
    values["action"] = ResolutionAction(values["action"])
    return ResolutionRecord(**values)
