"""Object types: Session, Turn, Event (each a Relay ``Node``) and their
connections (the Relay cursor connections spec)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, TypeVar

import strawberry
from strawberry.scalars import JSON

from keyturn.db.records import EventRecord, SessionRecord, TurnRecord
from keyturn.domain import EventType
from keyturn.resolvers import sessions as session_resolvers
from keyturn.resolvers import turns as turn_resolvers
from keyturn.resolvers.pagination import MAX_FIRST, MAX_UNPAGED_TURN_EVENTS, Page
from keyturn.resolvers.sessions import EventsRead
from keyturn.schema.budget import large
from keyturn.schema.context import Info
from keyturn.schema.enums import History, Multitask, TurnStatus
from keyturn.schema.tool_calls import ToolCall


@strawberry.interface(
    description="An object with an id unique across all types: Query.node(id) finds it again."
)
class Node:
    id: strawberry.ID


@strawberry.type
class PageInfo:
    has_next_page: bool
    has_previous_page: bool = strawberry.field(
        description="Paging forward: whether there is anything before `after` (true for any "
        "cursor). Paging backward: whether there is more before this page."
    )
    start_cursor: str | None
    end_cursor: str | None


T = TypeVar("T")


def _pairs(page: Page[T]) -> list[tuple[str, T]]:
    return list(zip(page.cursors, page.items, strict=True))


def _page_info(page: Page[Any]) -> PageInfo:
    return PageInfo(
        has_next_page=page.has_next,
        has_previous_page=page.has_previous,
        start_cursor=page.cursors[0] if page.cursors else None,
        end_cursor=page.cursors[-1] if page.cursors else None,
    )


@strawberry.type
class Event(Node):
    id: strawberry.ID = strawberry.field(description="A number, unique across all sessions.")
    session_id: strawberry.ID
    turn_id: strawberry.ID | None
    seq: int = strawberry.field(description="Per session: 1, 2, 3 … gapless, commit-ordered.")
    # A string, not an enum: GraphQL enum values cannot hold the dots clients
    # already match on, and the list grows (see the README).
    type: str = strawberry.field(description=", ".join(EventType))
    data: JSON = strawberry.field(extensions=large())
    created_at: datetime

    @classmethod
    def from_record(cls, e: EventRecord) -> Event:
        return _RecordEvent(e)


class _RecordEvent(Event):
    """An Event that builds its id strings only for a document that selects
    them: a page of events asks for a few fields, and building every id of
    every event would cost more than answering. The rest is copied as it is
    (slots, read by a plan without a call)."""

    __slots__ = ("_record", "created_at", "data", "seq", "type")

    def __init__(self, record: EventRecord) -> None:  # no dataclass fields to set
        self._record = record
        self.seq = record.seq
        self.type = record.type
        # JSON as read; not typing.cast, a call per event.
        self.data = record.data  # type: ignore[assignment]
        self.created_at = record.created_at

    @property
    def id(self) -> strawberry.ID:  # type: ignore[override]
        return strawberry.ID(str(self._record.id))

    @property
    def session_id(self) -> strawberry.ID:  # type: ignore[override]
        return strawberry.ID(str(self._record.session_id))

    @property
    def turn_id(self) -> strawberry.ID | None:  # type: ignore[override]
        turn_id = self._record.turn_id
        return strawberry.ID(str(turn_id)) if turn_id is not None else None


@strawberry.type
class EventEdge:
    cursor: str
    node: Event


class _PageEdge(EventEdge):
    """An EventEdge made from its two values in order: the dataclass's own
    ``__init__`` takes them by keyword, which for a page's hundred edges was
    a third of making them."""

    __slots__ = ()

    def __init__(self, cursor: str, node: Event) -> None:  # no dataclass fields to set
        self.cursor = cursor
        self.node = node


@strawberry.type
class EventConnection:
    edges: list[EventEdge]
    page_info: PageInfo
    total_count: int

    @classmethod
    def from_page(cls, page: Page[EventRecord]) -> EventConnection:
        if len(page.cursors) != len(page.items):
            raise ValueError("a page has one cursor for each item")
        edges: list[EventEdge] = list(map(_PageEdge, page.cursors, map(_RecordEvent, page.items)))
        return cls(edges=edges, page_info=_page_info(page), total_count=page.total)


@strawberry.type
class Turn(Node):
    id: strawberry.ID = strawberry.field(description="A UUID.")
    session_id: strawberry.ID
    idempotency_key: str
    input: str = strawberry.field(extensions=large())
    history: History = strawberry.field(description="The effective setting.")
    status: TurnStatus
    output: str | None = strawberry.field(extensions=large())
    error: str | None = strawberry.field(extensions=large())
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    epoch: int = strawberry.field(
        description="Fencing epoch: how many times the turn has been claimed to run."
    )
    owner: str | None = strawberry.field(description="The process that last claimed the turn.")
    retry_of: strawberry.ID | None = strawberry.field(
        description="The interrupted turn this one retries (resolveInterruptedTurn RETRY)."
    )
    cancel_requested: bool = strawberry.field(
        description="A cancel was asked for (cancelTurn, or a later submission's multitask "
        "INTERRUPT): the turn is CANCELLED, or its process stops it at the next safe point "
        "(it may still end otherwise, if it got there first)."
    )
    cancel_reason: str | None = strawberry.field(
        description="Why it was cancelled, as the cancel said.", extensions=large()
    )
    _record: strawberry.Private[TurnRecord]

    @classmethod
    def from_record(cls, t: TurnRecord) -> Turn:
        return cls(
            id=strawberry.ID(str(t.id)),
            session_id=strawberry.ID(str(t.session_id)),
            idempotency_key=t.idempotency_key,
            input=t.input,
            history=t.history,
            status=t.status,
            output=t.output,
            error=t.error,
            created_at=t.created_at,
            started_at=t.started_at,
            completed_at=t.completed_at,
            epoch=t.epoch,
            owner=t.owner,
            retry_of=strawberry.ID(str(t.retry_of)) if t.retry_of is not None else None,
            cancel_requested=t.cancel_requested_at is not None,
            cancel_reason=t.cancel_reason,
            _record=t,
        )

    @strawberry.field(  # type: ignore[untyped-decorator]
        description="In seq order, those with seq > afterSeq: `first` of them (at most "
        f"{MAX_FIRST}), or without `first` all of them, when they are at most "
        f"{MAX_UNPAGED_TURN_EVENTS} (a turn with more answers BAD_USER_INPUT: page with "
        "first/afterSeq). Costed by `first`, else by that bound."
    )
    async def events(
        self, info: Info, first: int | None = None, after_seq: int | None = 0
    ) -> list[Event]:
        rows = await turn_resolvers.turn_events(
            info.context, turn=self._record, first=first, after_seq=after_seq
        )
        return [Event.from_record(e) for e in rows]

    @strawberry.field(  # type: ignore[untyped-decorator]
        description="The turn's tool calls, by index, as the tool ledger establishes them."
    )
    async def tool_calls(self, info: Info) -> list[ToolCall]:
        views = await turn_resolvers.tool_calls(info.context, turn=self._record)
        return [ToolCall.from_view(v) for v in views]


@strawberry.type
class TurnEdge:
    cursor: str
    node: Turn


@strawberry.type
class TurnConnection:
    edges: list[TurnEdge]
    page_info: PageInfo
    total_count: int

    @classmethod
    def from_page(cls, page: Page[TurnRecord]) -> TurnConnection:
        edges = [TurnEdge(cursor=c, node=Turn.from_record(x)) for c, x in _pairs(page)]
        return cls(edges=edges, page_info=_page_info(page), total_count=page.total)


@strawberry.type
class Session(Node):
    id: strawberry.ID = strawberry.field(description="A UUID.")
    created_at: datetime
    default_history: History
    multitask: Multitask = strawberry.field(
        description="What a submission does while a turn of the session is queued or running."
    )
    event_count: int = strawberry.field(description="Events saved for this session so far.")
    _id: strawberry.Private[uuid.UUID]
    # A page of events read with the session, for its events field.
    _events: strawberry.Private[EventsRead | None] = None

    @classmethod
    def from_record(cls, s: SessionRecord, *, events: EventsRead | None = None) -> Session:
        return cls(
            id=strawberry.ID(str(s.id)),
            created_at=s.created_at,
            default_history=s.default_history,
            multitask=s.multitask,
            event_count=s.event_seq,
            _id=s.id,
            _events=events,
        )

    @strawberry.field(  # type: ignore[untyped-decorator]
        description="In admission order: forward with first/after (20 by default), or the "
        "latest with last/before."
    )
    async def turns(
        self,
        info: Info,
        first: int | None = None,
        after: str | None = None,
        last: int | None = None,
        before: str | None = None,
    ) -> TurnConnection:
        page = await session_resolvers.session_turns(
            info.context, session_id=self._id, first=first, after=after, last=last, before=before
        )
        return TurnConnection.from_page(page)

    @strawberry.field(  # type: ignore[untyped-decorator]
        description="In seq order: forward with first/after (100 by default), or the latest "
        "with last/before."
    )
    async def events(
        self,
        info: Info,
        first: int | None = None,
        after: str | None = None,
        last: int | None = None,
        before: str | None = None,
    ) -> EventConnection:
        page = await session_resolvers.session_events(
            info.context,
            session_id=self._id,
            event_count=self.event_count,
            first=first,
            after=after,
            last=last,
            before=before,
            read=self._events,
        )
        return EventConnection.from_page(page)


@strawberry.type
class SessionEdge:
    cursor: str
    node: Session


@strawberry.type
class SessionConnection:
    edges: list[SessionEdge]
    page_info: PageInfo
    total_count: int

    @classmethod
    def from_page(cls, page: Page[SessionRecord]) -> SessionConnection:
        edges = [SessionEdge(cursor=c, node=Session.from_record(x)) for c, x in _pairs(page)]
        return cls(edges=edges, page_info=_page_info(page), total_count=page.total)


def node_from_record(record: SessionRecord | TurnRecord | EventRecord) -> Node:
    if isinstance(record, SessionRecord):
        return Session.from_record(record)
    if isinstance(record, TurnRecord):
        return Turn.from_record(record)
    return Event.from_record(record)
