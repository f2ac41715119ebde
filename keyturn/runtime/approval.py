"""Approval of tool calls: which calls wait for a person, and their decisions.

A call needs approval when the tools file says so for its tool (``approve =
true``) or, with ``KEYTURN_APPROVE_UNSAFE=true``, when its tool is UNSAFE
(``approve = false`` in the file exempts one). When the model asks for such a
call, the runner records ``tool.approval_requested`` and the turn becomes
WAITING with no lease (:mod:`keyturn.db.approvals`). ``decideToolCall``
records ``tool.approved`` or ``tool.rejected`` under a key and puts the turn
back in the queue; whichever process claims it resumes it from its record.

Decisions are idempotent under their key, like admissions and resolutions: a
key belongs to the turn's session and shares its namespace with the
session's turn and resolution keys.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any

from keyturn.db import approvals as db
from keyturn.db import reads
from keyturn.db.engine import Engine, connect
from keyturn.db.records import EventRecord, TurnRecord
from keyturn.domain import EventType, ToolKind, TurnStatus
from keyturn.errors import InvalidRequest
from keyturn.runtime.validation import check_key, parse_uuid

MAX_NOTE_CHARS = 2000


class ToolCallDecision(StrEnum):
    APPROVE = "APPROVE"
    REJECT = "REJECT"


_EVENT = {
    ToolCallDecision.APPROVE: EventType.TOOL_APPROVED,
    ToolCallDecision.REJECT: EventType.TOOL_REJECTED,
}
_DECISION = {event: decision for decision, event in _EVENT.items()}


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """Which tools' calls wait for a decision."""

    approve_unsafe: bool = False
    # From the tools file: True requires approval, False exempts the tool.
    tools: Mapping[str, bool] | None = None

    def requires(self, tool: str, kind: ToolKind) -> bool:
        named = (self.tools or {}).get(tool)
        if named is not None:
            return named
        return self.approve_unsafe and kind is ToolKind.UNSAFE


def refusal(note: str) -> dict[str, Any]:
    """What the model is shown of a rejected call, as its result."""
    return {"error": f"refused by a person: {note}" if note else "refused by a person"}


@dataclass(frozen=True, slots=True)
class Decided:
    """A decision in the record: the data of its event."""

    index: int
    decision: ToolCallDecision
    idempotency_key: str
    fingerprint: str
    result: dict[str, Any] | None  # REJECT: the refusal shown to the model

    @classmethod
    def from_event(cls, type: str, data: Mapping[str, Any]) -> Decided:
        return cls(
            index=int(data["index"]),
            decision=_DECISION[EventType(type)],
            idempotency_key=str(data.get("idempotencyKey", "")),
            fingerprint=str(data.get("fingerprint", "")),
            result=data.get("result"),
        )


def decisions(events: Sequence[EventRecord]) -> dict[int, Decided]:
    """A turn's decisions, by call index."""
    return {
        int(e.data["index"]): Decided.from_event(e.type, e.data)
        for e in events
        if e.type in (EventType.TOOL_APPROVED, EventType.TOOL_REJECTED)
    }


def open_request(turn: TurnRecord, events: Sequence[EventRecord]) -> dict[str, Any] | None:
    """The data of the request the turn waits on, if it is WAITING."""
    if turn.status is not TurnStatus.WAITING:
        return None
    for event in reversed(sorted(events, key=lambda e: e.seq)):
        if event.type == EventType.TOOL_APPROVAL_REQUESTED:
            return event.data if event.data.get("epoch") == turn.epoch else None
    return None


@dataclass(frozen=True, slots=True)
class DecisionRequest:
    turn_id: uuid.UUID
    index: int
    decision: ToolCallDecision
    idempotency_key: str
    note: str

    @classmethod
    def parse(
        cls,
        *,
        turn_id: str,
        index: int,
        decision: ToolCallDecision,
        idempotency_key: str,
        note: str | None,
    ) -> DecisionRequest:
        tid = parse_uuid(turn_id, field="turnId")
        if index < 0:
            raise InvalidRequest("index", "index must not be negative")
        check_key(idempotency_key)
        text = note or ""
        if len(text) > MAX_NOTE_CHARS:
            raise InvalidRequest("note", f"note must be at most {MAX_NOTE_CHARS} characters")
        if "\x00" in text:
            raise InvalidRequest("note", "note must not contain the NUL character")
        return cls(tid, index, decision, idempotency_key, text)

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        parts = ("keyturn/decision/v1", str(self.turn_id), str(self.index), self.decision)
        for part in (*parts, self.note):
            digest.update(part.encode())
            digest.update(b"\x00")
        return digest.hexdigest()


class DecisionOutcome(Enum):
    ACCEPTED = "accepted"
    REPLAYED = "replayed"
    CONFLICT = "conflict"  # the key names another request in the session
    TURN_NOT_FOUND = "turn_not_found"
    NOT_AWAITING = "not_awaiting"  # the call does not wait for a decision
    ALREADY_DECIDED = "already_decided"  # another key decided this call first


@dataclass(frozen=True, slots=True)
class DecisionResult:
    outcome: DecisionOutcome
    turn: TurnRecord | None = None
    index: int = 0
    decision: ToolCallDecision | None = None  # the one recorded for the call
    conflicting_turn_id: uuid.UUID | None = None


async def decide(*, engine: Engine, request: DecisionRequest, tenant: str) -> DecisionResult:
    fp = request.fingerprint()
    async with connect(engine) as conn:
        # Twice at most: a decision that lost a race judges again what won.
        for _attempt in range(2):
            found = await db.lookup(
                conn, tenant=tenant, turn_id=request.turn_id, key=request.idempotency_key
            )
            if found is None:
                return DecisionResult(DecisionOutcome.TURN_NOT_FOUND)
            turn, holder = found
            if holder.held:
                return _judge(turn, holder, fp)
            events = await reads.turn_events(conn, turn_id=turn.id)
            earlier = decisions(events).get(request.index)
            if earlier is not None:
                # Decided since the lookup, perhaps under this very key (an
                # identical request racing this one): the key is judged first.
                again = await db.lookup(
                    conn, tenant=tenant, turn_id=request.turn_id, key=request.idempotency_key
                )
                if again is not None and again[1].held:
                    return _judge(again[0], again[1], fp)
                return DecisionResult(
                    DecisionOutcome.ALREADY_DECIDED, turn, request.index, earlier.decision
                )
            waiting = open_request(turn, events)
            if waiting is None or int(waiting["index"]) != request.index:
                return DecisionResult(DecisionOutcome.NOT_AWAITING, turn, request.index)
            data: dict[str, Any] = {
                "index": request.index,
                "tool": waiting.get("tool"),
                "arguments": waiting.get("arguments", {}),
                "kind": waiting.get("kind"),
                "effectKey": waiting.get("effectKey"),
                "decision": request.decision,
                "note": request.note,
                "idempotencyKey": request.idempotency_key,
                "fingerprint": fp,
                "epoch": turn.epoch,
            }
            if request.decision is ToolCallDecision.REJECT:
                data["result"] = refusal(request.note)
            if await db.decide(
                conn,
                tenant=tenant,
                turn_id=turn.id,
                epoch=turn.epoch,
                key=request.idempotency_key,
                type=_EVENT[request.decision],
                data=data,
            ):
                after = await db.turn(conn, turn_id=turn.id)
                return DecisionResult(
                    DecisionOutcome.ACCEPTED, after or turn, request.index, request.decision
                )
        return DecisionResult(DecisionOutcome.NOT_AWAITING, turn, request.index)


def _judge(turn: TurnRecord, holder: db.KeyHolder, fp: str) -> DecisionResult:
    if holder.decision is not None:
        decided = Decided.from_event(holder.decision["type"], holder.decision["data"])
        named = uuid.UUID(str(holder.decision["turnId"]))
        if decided.fingerprint == fp:
            return DecisionResult(DecisionOutcome.REPLAYED, turn, decided.index, decided.decision)
        return DecisionResult(DecisionOutcome.CONFLICT, turn, conflicting_turn_id=named)
    existing = holder.turn_id or holder.decided_turn
    return DecisionResult(DecisionOutcome.CONFLICT, turn, conflicting_turn_id=existing)


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A call that waits for a decision."""

    cursor: int  # the id of its tool.approval_requested event
    turn: TurnRecord
    index: int
    tool: str
    arguments: dict[str, Any]
    kind: ToolKind
    effect_key: str


async def pending(
    *, engine: Engine, tenant: str, after: int, limit: int
) -> tuple[list[PendingApproval], bool]:
    """Up to ``limit`` waiting calls after the cursor ``after``, and whether
    there are more."""
    async with connect(engine) as conn:
        rows = await db.pending(conn, tenant=tenant, after=after, limit=limit + 1)
    items = [
        PendingApproval(
            cursor=r.event_id,
            turn=r.turn,
            index=int(r.data["index"]),
            tool=str(r.data.get("tool", "")),
            arguments=dict(r.data.get("arguments", {})),
            kind=ToolKind(r.data.get("kind", ToolKind.UNSAFE)),
            effect_key=str(r.data.get("effectKey", "")),
        )
        for r in rows
    ]
    return items[:limit], len(items) > limit
