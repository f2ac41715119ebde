"""Root types. Each field only delegates to a resolver and wraps the result.

No field catches an error: :mod:`keyturn.schema.errors` decides what a client
sees, and turns an invalid request into the ``InvalidInput`` union member.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

import strawberry

from keyturn.resolvers import (
    approvals,
    cancels,
    nodes,
    policy,
    resolutions,
    sessions,
    streams,
    tools,
    turns,
)
from keyturn.schema.approval import (
    DecideToolCallInput,
    DecideToolCallResult,
    PendingApprovalConnection,
    from_decision,
)
from keyturn.schema.cancel import CancelTurnInput, CancelTurnResult, from_cancel
from keyturn.schema.context import Info, child_arguments, child_selects_only, selects
from keyturn.schema.deletion import DeleteSessionInput, DeleteSessionResult, from_deletion
from keyturn.schema.enums import History, Multitask
from keyturn.schema.errors import answers_invalid_input
from keyturn.schema.inputs import CreateSessionInput, SubmitTurnInput
from keyturn.schema.policy import ServerPolicy
from keyturn.schema.resolution import (
    ResolveInterruptedTurnInput,
    ResolveInterruptedTurnResult,
    from_resolution,
)
from keyturn.schema.results import SubmitTurnResult, from_admission
from keyturn.schema.tools import ToolInfo
from keyturn.schema.types import Event, Node, Session, SessionConnection, Turn, node_from_record

# The arguments of Session.events that say which page it is.
_EVENT_WINDOW = frozenset({"first", "after", "last", "before"})
# What a page's events may select and still be read without their ids and time.
_LEAN_EVENT = frozenset({"seq", "type", "data", "__typename"})


@strawberry.type
class Query:
    @strawberry.field
    async def session(self, info: Info, id: strawberry.ID) -> Session | None:
        page = child_arguments(info, "events")
        # Only a window is read ahead: an argument that chose other events
        # would not be part of the page the read is kept under.
        if page is None or not page.keys() <= _EVENT_WINDOW:
            found = await sessions.get_session(info.context, session_id=id)
            return Session.from_record(found) if found is not None else None
        # The session and the page of events selected on it, in one read.
        lean = child_selects_only(info, "events", ("edges", "node"), _LEAN_EVENT)
        found, read = await sessions.get_session_with_events(
            info.context, session_id=id, lean=lean, **page
        )
        return Session.from_record(found, events=read) if found is not None else None

    @strawberry.field
    async def sessions(
        self, info: Info, first: int | None = 20, after: str | None = None
    ) -> SessionConnection:
        page = await sessions.list_sessions(
            info.context,
            first=20 if first is None else first,
            after=after,
            count=selects(info, "totalCount"),
        )
        return SessionConnection.from_page(page)

    @strawberry.field
    async def turn(self, info: Info, id: strawberry.ID) -> Turn | None:
        found = await turns.get_turn(info.context, turn_id=id)
        return Turn.from_record(found) if found is not None else None

    @strawberry.field(  # type: ignore[untyped-decorator]
        description="How long this server keeps keys, turns and tombstones: its published "
        "retention policy."
    )
    def server_policy(self, info: Info) -> ServerPolicy:
        return ServerPolicy.from_policy(policy.server_policy(info.context))

    @strawberry.field(description="Any session, turn or event by its id; null if none.")  # type: ignore[untyped-decorator]
    async def node(self, info: Info, id: strawberry.ID) -> Node | None:
        found = await nodes.node(info.context, id=id)
        return node_from_record(found) if found is not None else None

    @strawberry.field(description="Several nodes at once (at most 100), in the order asked.")  # type: ignore[untyped-decorator]
    async def nodes(self, info: Info, ids: list[strawberry.ID]) -> list[Node | None]:
        found = await nodes.nodes(info.context, ids=ids)
        return [node_from_record(f) if f is not None else None for f in found]

    @strawberry.field(  # type: ignore[untyped-decorator]
        description="The tools this server offers the model: builtin, from MCP servers "
        "and from Python entry points, by name."
    )
    def tools(self, info: Info) -> list[ToolInfo]:
        return [ToolInfo.from_info(t) for t in tools.list_tools(info.context)]

    @strawberry.field(  # type: ignore[untyped-decorator]
        description="Tool calls of the caller's turns that wait for decideToolCall, oldest "
        "request first."
    )
    async def pending_approvals(
        self, info: Info, first: int | None = 20, after: str | None = None
    ) -> PendingApprovalConnection:
        page = await approvals.pending_approvals(
            info.context, first=20 if first is None else first, after=after
        )
        return PendingApprovalConnection.from_page(page)


@strawberry.type
class Mutation:
    @strawberry.mutation
    async def create_session(self, info: Info, input: CreateSessionInput | None = None) -> Session:
        given = input or CreateSessionInput()
        return Session.from_record(
            await sessions.create_session(
                info.context,
                default_history=given.default_history or History.FULL,
                multitask=given.multitask or Multitask.ENQUEUE,
            )
        )

    @strawberry.mutation(  # type: ignore[untyped-decorator]
        description="Delete a session with its turns, events and keys; a running turn is "
        "cancelled first, and the deletion waits for it to stop. Idempotent under its key."
    )
    @answers_invalid_input
    async def delete_session(self, info: Info, input: DeleteSessionInput) -> DeleteSessionResult:
        result = await sessions.delete_session(
            info.context, session_id=str(input.session_id), idempotency_key=input.idempotency_key
        )
        return from_deletion(result, session_id=str(input.session_id), key=input.idempotency_key)

    @strawberry.mutation
    @answers_invalid_input
    async def submit_turn(self, info: Info, input: SubmitTurnInput) -> SubmitTurnResult:
        admission = await turns.submit_turn(
            info.context,
            session_id=str(input.session_id),
            idempotency_key=input.idempotency_key,
            input=input.input,
            history=input.history,
            multitask=input.multitask,
        )
        return from_admission(
            admission, session_id=str(input.session_id), key=input.idempotency_key
        )

    @strawberry.mutation(  # type: ignore[untyped-decorator]
        description="Decide what happens to an INTERRUPTED turn: RETRY it (a new turn that "
        "reuses completed and reconciled tool results) or ABANDON it. Idempotent under its key."
    )
    @answers_invalid_input
    async def resolve_interrupted_turn(
        self, info: Info, input: ResolveInterruptedTurnInput
    ) -> ResolveInterruptedTurnResult:
        result = await resolutions.resolve_interrupted_turn(
            info.context,
            turn_id=str(input.turn_id),
            action=input.action,
            idempotency_key=input.idempotency_key,
            force=input.force,
        )
        return from_resolution(
            result, turn_id=str(input.turn_id), key=input.idempotency_key, action=input.action
        )

    @strawberry.mutation(  # type: ignore[untyped-decorator]
        description="Cancel a turn: a QUEUED or WAITING one ends at once (CANCELLED); a "
        "RUNNING one is stopped by its process at the next safe point, with its output so far. "
        "Idempotent under its key."
    )
    @answers_invalid_input
    async def cancel_turn(self, info: Info, input: CancelTurnInput) -> CancelTurnResult:
        result = await cancels.cancel_turn(
            info.context,
            turn_id=str(input.turn_id),
            idempotency_key=input.idempotency_key,
            reason=input.reason,
        )
        return from_cancel(result, turn_id=str(input.turn_id), key=input.idempotency_key)

    @strawberry.mutation(  # type: ignore[untyped-decorator]
        description="Decide a tool call that waits for approval: APPROVE runs it, REJECT "
        "refuses it (the model is told). The turn then resumes. Idempotent under its key."
    )
    @answers_invalid_input
    async def decide_tool_call(
        self, info: Info, input: DecideToolCallInput
    ) -> DecideToolCallResult:
        result = await approvals.decide_tool_call(
            info.context,
            turn_id=str(input.turn_id),
            index=input.index,
            decision=input.decision,
            idempotency_key=input.idempotency_key,
            note=input.note,
        )
        return from_decision(result, turn_id=str(input.turn_id), key=input.idempotency_key)


R = TypeVar("R")
T = TypeVar("T")


class _Live(Generic[R, T]):
    """A subscription's stream: the runtime's records, each as its GraphQL
    type. The runtime's stream is asked for at the first read, so a bad id
    is an error of the stream, as from a generator (not of the resolver).

    Not an async generator wrapping the runtime's stream: its frame, and in
    it the resolver's info (the field's nodes, path and info objects), would
    live for as long as the subscription waits."""

    __slots__ = ("_convert", "_open", "_records")

    def __init__(self, open_records: Callable[[], AsyncIterator[R]], convert: Callable[[R], T]):
        self._open = open_records
        self._convert = convert
        self._records: AsyncIterator[R] | None = None

    def __aiter__(self) -> _Live[R, T]:
        return self

    async def __anext__(self) -> T:
        if self._records is None:
            self._records = self._open()
        return self._convert(await anext(self._records))

    async def aclose(self) -> None:
        aclose = getattr(self._records, "aclose", None)
        if aclose is not None:
            await aclose()


@strawberry.type
class Subscription:
    @strawberry.subscription(  # type: ignore[untyped-decorator]
        description="Yields the turn once it has ended (at once if it already has), then completes."
    )
    def turn_completed(self, info: Info, turn_id: strawberry.ID) -> AsyncIterator[Turn]:
        ctx = info.context
        return _Live(lambda: streams.turn_completed(ctx, turn_id=turn_id), Turn.from_record)

    @strawberry.subscription(  # type: ignore[untyped-decorator]
        description="The turn's events with seq > afterSeq, from the record, then live, in "
        "seq order with no gap and no duplicate; completes after its terminal event "
        "(turn.completed, turn.failed, turn.interrupted or turn.cancelled)."
    )
    def turn_events(
        self, info: Info, turn_id: strawberry.ID, after_seq: int | None = 0
    ) -> AsyncIterator[Event]:
        ctx = info.context
        return _Live(
            lambda: streams.turn_events(ctx, turn_id=turn_id, after_seq=after_seq or 0),
            Event.from_record,
        )

    @strawberry.subscription(  # type: ignore[untyped-decorator]
        description="Every event with seq > afterSeq, from the record, then live; in seq "
        "order, no gap, no duplicate."
    )
    def session_events(
        self, info: Info, session_id: strawberry.ID, after_seq: int | None = 0
    ) -> AsyncIterator[Event]:
        ctx = info.context
        return _Live(
            lambda: streams.session_events(ctx, session_id=session_id, after_seq=after_seq or 0),
            Event.from_record,
        )
