"""Cancelling a turn: a record entry first, an action second.

``cancelTurn`` is idempotent under its key like every decision: the same key
and the same request (turn and reason) replay the first answer and write
nothing; the key naming anything else in the session conflicts. A turn not
yet running ends at once (CANCELLED, ``turn.cancelled``). A running one gets
``turn.cancel_requested`` and a wake-up; the process running it stops at the
next safe point — between two pieces of the model's stream, between model
steps, before the next tool intent, never between a tool's intent and its
result — and records ``turn.cancelled`` with what it produced so far
(:class:`CancelSignal` is how that process's turn hears of it).
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from dataclasses import dataclass
from enum import Enum

from keyturn.db import cancels as db
from keyturn.db.engine import Engine, connect
from keyturn.db.records import TurnRecord
from keyturn.domain import TERMINAL_STATUSES, TurnStatus
from keyturn.errors import CancelRequested, InvalidRequest
from keyturn.runtime.validation import check_key, parse_uuid

MAX_REASON_CHARS = 1000


@dataclass(frozen=True, slots=True)
class CancelRequest:
    turn_id: uuid.UUID
    idempotency_key: str
    reason: str | None

    @classmethod
    def parse(cls, *, turn_id: str, idempotency_key: str, reason: str | None) -> CancelRequest:
        tid = parse_uuid(turn_id, field="turnId")
        check_key(idempotency_key)
        if reason is not None:
            if len(reason) > MAX_REASON_CHARS:
                raise InvalidRequest(
                    "reason", f"reason must be at most {MAX_REASON_CHARS} characters"
                )
            if "\x00" in reason:
                raise InvalidRequest("reason", "reason must not contain the NUL character")
            try:
                reason.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidRequest("reason", "reason is not valid Unicode text") from None
        return cls(tid, idempotency_key, reason)

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        digest.update(b"keyturn/cancel/v1\x00")
        digest.update(str(self.turn_id).encode())
        digest.update(b"\x00")
        # No reason and an empty one are different requests.
        digest.update(b"-" if self.reason is None else b"+" + self.reason.encode("utf-8"))
        return digest.hexdigest()


class CancelOutcome(Enum):
    CANCELLED = "cancelled"  # the turn ended here, or its process was asked to stop it
    REPLAYED = "replayed"
    CONFLICT = "conflict"  # the key names something else in the session
    TURN_NOT_FOUND = "turn_not_found"
    NOT_CANCELLABLE = "not_cancellable"  # it ended otherwise
    ALREADY_CANCELLED = "already_cancelled"  # another cancel (key or submission) has it


@dataclass(frozen=True, slots=True)
class CancelResult:
    outcome: CancelOutcome
    turn: TurnRecord | None = None
    conflicting_turn_id: uuid.UUID | None = None


async def cancel_turn(*, engine: Engine, request: CancelRequest, tenant: str) -> CancelResult:
    fp = request.fingerprint()
    async with connect(engine) as conn:
        write = await db.cancel(
            conn,
            tenant=tenant,
            turn_id=request.turn_id,
            key=request.idempotency_key,
            fingerprint=fp,
            reason=request.reason,
        )
    found = write.lookup
    if found is None:
        return CancelResult(CancelOutcome.TURN_NOT_FOUND)
    if write.written is not None:
        return CancelResult(CancelOutcome.CANCELLED, write.written)
    turn = found.turn
    if found.cancelled_turn_id is not None:
        if found.cancelled_turn_id == turn.id and turn.cancel_fingerprint == fp:
            return CancelResult(CancelOutcome.REPLAYED, turn)
        return CancelResult(
            CancelOutcome.CONFLICT, turn, conflicting_turn_id=found.cancelled_turn_id
        )
    taken = found.key_turn_id or found.resolved_turn_id or found.decided_turn_id
    if taken is not None:
        return CancelResult(CancelOutcome.CONFLICT, turn, conflicting_turn_id=taken)
    if turn.status in TERMINAL_STATUSES and turn.status is not TurnStatus.CANCELLED:
        # Ended otherwise, perhaps while a cancel asked earlier was on its way.
        return CancelResult(CancelOutcome.NOT_CANCELLABLE, turn)
    if turn.cancel_requested_at is not None:
        return CancelResult(CancelOutcome.ALREADY_CANCELLED, turn)
    # Nothing else leaves a turn uncancelled under the session lock.
    raise AssertionError(f"turn {turn.id}: a cancel of a {turn.status} turn wrote nothing")


def cancel_requested(turn: TurnRecord) -> bool:
    """Asked for and not yet acted on: the turn still runs toward its stop."""
    return turn.cancel_requested_at is not None and turn.status is not TurnStatus.CANCELLED


class CancelSignal:
    """How a running turn hears that its cancel was asked for, and where it
    stands when it does.

    The tool runner marks the call in flight (between its intent and its
    result), so that the end can say which call was running when the cancel
    arrived; the safe points call :meth:`check`."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason: str | None = None
        self.in_flight: int | None = None  # the index of the call now between intent and result
        self.arrived_during: int | None = None  # the call in flight when the cancel arrived

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, reason: str | None) -> None:
        if self._event.is_set():
            return
        self.reason = reason
        self.arrived_during = self.in_flight
        self._event.set()

    def check(self) -> None:
        """A safe point: raises CancelRequested once the cancel was asked for."""
        if self._event.is_set():
            raise CancelRequested()

    async def wait(self) -> None:
        await self._event.wait()
