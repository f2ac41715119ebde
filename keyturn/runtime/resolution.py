"""Explicit resolution of an interrupted turn: RETRY it under a new key, or
ABANDON it. Idempotent under its key, like admission: the same key and the
same request replay the first answer, a changed request conflicts."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from enum import Enum

from keyturn.db import reads
from keyturn.db import resolutions as db
from keyturn.db.engine import Conn, Engine, connect
from keyturn.db.records import ResolutionRecord, TurnRecord
from keyturn.domain import ResolutionAction, TurnStatus
from keyturn.runtime.ledger import ToolCallView, tool_calls, unsafe_unknown
from keyturn.runtime.validation import check_key, parse_uuid


@dataclass(frozen=True, slots=True)
class ResolutionRequest:
    turn_id: uuid.UUID
    action: ResolutionAction
    idempotency_key: str
    force: bool

    @classmethod
    def parse(
        cls, *, turn_id: str, action: ResolutionAction, idempotency_key: str, force: bool
    ) -> ResolutionRequest:
        tid = parse_uuid(turn_id, field="turnId")
        check_key(idempotency_key)
        return cls(tid, action, idempotency_key, force)

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for part in ("keyturn/resolution/v1", self.action, str(self.turn_id)):
            digest.update(part.encode())
            digest.update(b"\x00")
        digest.update(b"1" if self.force else b"0")
        return digest.hexdigest()


class ResolutionOutcome(Enum):
    ACCEPTED = "accepted"
    REPLAYED = "replayed"
    CONFLICT = "conflict"  # the key names a different request (or a submitted turn)
    TURN_NOT_FOUND = "turn_not_found"
    NOT_INTERRUPTED = "not_interrupted"
    ALREADY_RESOLVED = "already_resolved"  # another key already resolved this turn
    UNSAFE_REFUSED = "unsafe_refused"


@dataclass(frozen=True, slots=True)
class ResolutionResult:
    outcome: ResolutionOutcome
    turn: TurnRecord | None = None  # the interrupted turn
    resolution: ResolutionRecord | None = None
    retry: TurnRecord | None = None  # RETRY: the new turn
    conflicting_turn_id: uuid.UUID | None = None
    unsafe_call: ToolCallView | None = None


async def resolve(*, engine: Engine, request: ResolutionRequest, tenant: str) -> ResolutionResult:
    fp = request.fingerprint()
    async with connect(engine) as conn:
        found = await db.lookup(
            conn, tenant=tenant, turn_id=request.turn_id, key=request.idempotency_key
        )
        if found is None:
            return ResolutionResult(ResolutionOutcome.TURN_NOT_FOUND)
        if found.by_key is not None or found.key_turn_id is not None:
            return await _judge(conn, found.turn, found.by_key, found.key_turn_id, fp)
        if found.turn.status is not TurnStatus.INTERRUPTED:
            return ResolutionResult(ResolutionOutcome.NOT_INTERRUPTED, found.turn)
        if found.of_turn is not None:
            return ResolutionResult(
                ResolutionOutcome.ALREADY_RESOLVED,
                found.turn,
                found.of_turn,
                await _retry(conn, found.of_turn),
            )
        if request.action is ResolutionAction.RETRY and not request.force:
            # The interrupted turn's unsafe calls cannot change any more: its
            # writes are fenced, and only idempotent calls get reconciled.
            # READ_ONLY and REPEATABLE calls of unknown outcome need no force:
            # running them again adds no effect (keyturn.runtime.ledger).
            calls = tool_calls(await reads.turn_events(conn, turn_id=found.turn.id))
            unsafe = unsafe_unknown(calls)
            if unsafe is not None:
                return ResolutionResult(
                    ResolutionOutcome.UNSAFE_REFUSED, found.turn, unsafe_call=unsafe
                )
        resolution = await db.resolve(
            conn,
            tenant=tenant,
            turn_id=request.turn_id,
            key=request.idempotency_key,
            fingerprint=fp,
            action=request.action,
            force=request.force,
            new_turn_id=uuid.uuid4() if request.action is ResolutionAction.RETRY else None,
        )
        if resolution is not None:
            turn = await db.turn(conn, turn_id=request.turn_id)
            return ResolutionResult(
                ResolutionOutcome.ACCEPTED, turn, resolution, await _retry(conn, resolution)
            )
        # Lost a race: read what won, on the same terms as above.
        again = await db.lookup(
            conn, tenant=tenant, turn_id=request.turn_id, key=request.idempotency_key
        )
        if again is None:
            return ResolutionResult(ResolutionOutcome.TURN_NOT_FOUND)
        if again.by_key is not None or again.key_turn_id is not None:
            return await _judge(conn, again.turn, again.by_key, again.key_turn_id, fp)
        if again.of_turn is not None:
            return ResolutionResult(
                ResolutionOutcome.ALREADY_RESOLVED,
                again.turn,
                again.of_turn,
                await _retry(conn, again.of_turn),
            )
        return ResolutionResult(ResolutionOutcome.NOT_INTERRUPTED, again.turn)


async def _retry(conn: Conn, resolution: ResolutionRecord) -> TurnRecord | None:
    if resolution.new_turn_id is None:
        return None
    return await db.turn(conn, turn_id=resolution.new_turn_id)


async def _judge(
    conn: Conn,
    turn: TurnRecord,
    by_key: ResolutionRecord | None,
    key_turn_id: uuid.UUID | None,
    fp: str,
) -> ResolutionResult:
    if by_key is not None and by_key.fingerprint == fp:
        return ResolutionResult(
            ResolutionOutcome.REPLAYED, turn, by_key, await _retry(conn, by_key)
        )
    existing = (by_key.new_turn_id or by_key.turn_id) if by_key is not None else key_turn_id
    return ResolutionResult(ResolutionOutcome.CONFLICT, turn, by_key, conflicting_turn_id=existing)
