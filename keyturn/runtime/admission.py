"""Admission: which request is this — a new turn, the same one again, or a
different request wrongly given a used key?"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from enum import Enum

from keyturn.db import admission as db
from keyturn.db.engine import Engine, connect
from keyturn.db.records import TurnRecord
from keyturn.domain import History
from keyturn.errors import DatabaseUnavailable, OutcomeUnknown
from keyturn.runtime.stats import NoStats, Stats
from keyturn.runtime.validation import TurnRequest, fingerprint

log = logging.getLogger(__name__)


class AdmissionOutcome(Enum):
    ACCEPTED = "accepted"
    REPLAYED = "replayed"
    CONFLICT = "conflict"
    SESSION_NOT_FOUND = "session_not_found"


@dataclass(frozen=True, slots=True)
class Admission:
    outcome: AdmissionOutcome
    turn: TurnRecord | None = None


def _judge(existing: TurnRecord, fp: str) -> Admission:
    if existing.fingerprint == fp:
        return Admission(AdmissionOutcome.REPLAYED, existing)
    return Admission(AdmissionOutcome.CONFLICT, existing)


async def admit_turn(
    *,
    engine: Engine,
    request: TurnRequest,
    tenant: str = "",
    stats: Stats | None = None,
    log_inputs: bool = False,
) -> Admission:
    """Admit ``request`` (see ``_admit``), counted and logged. Inputs are the
    users' words: logged only with ``log_inputs``."""
    stats = stats or NoStats()
    started = time.perf_counter()
    extra: dict[str, object] = {
        "session_id": str(request.session_id),
        "idempotency_key": request.idempotency_key,
    }
    if log_inputs:
        extra["input"] = request.input
    try:
        admission = await _admit(engine=engine, request=request, tenant=tenant)
    except DatabaseUnavailable:
        stats.admitted("unavailable", time.perf_counter() - started)
        log.warning("admission unavailable", extra=extra)
        raise
    stats.admitted(admission.outcome.value, time.perf_counter() - started)
    if admission.turn is not None:
        extra["turn_id"] = str(admission.turn.id)
    log.info("admission %s", admission.outcome.value, extra=extra)
    return admission


async def _admit(*, engine: Engine, request: TurnRequest, tenant: str) -> Admission:
    """Admit ``request`` or say which turn already holds its key.

    A key that already names a turn is answered from one read and writes
    nothing. Otherwise the single admission statement tries to claim the key;
    when it loses a race, a separate read finds the winner. If the connection
    dies while the statement commits, the outcome is unknown: it is settled by
    reading the key again on a fresh connection, never guessed.
    """
    turn_id = uuid.uuid4()
    fp = ""
    writing = False  # once the admission statement is sent, its outcome must be settled
    try:
        # One pooled connection for the whole admission: a checkout costs
        # about as much as a short statement.
        async with connect(engine) as conn:
            found = await db.lookup(
                conn, tenant=tenant, session_id=request.session_id, key=request.idempotency_key
            )
            if not found.session_found:
                return Admission(AdmissionOutcome.SESSION_NOT_FOUND)
            history = request.effective_history(found.default_history or History.FULL)
            fp = fingerprint(input=request.input, history=history)
            if found.existing is not None:
                return _judge(found.existing, fp)
            writing = True
            turn = await db.insert_turn(
                conn,
                tenant=tenant,
                turn_id=turn_id,
                session_id=request.session_id,
                key=request.idempotency_key,
                fingerprint=fp,
                input=request.input,
                history=history,
                data={"idempotencyKey": request.idempotency_key, "history": history},
            )
            if turn is not None:
                return Admission(AdmissionOutcome.ACCEPTED, turn)
            winner = await db.turn_by_key(
                conn, session_id=request.session_id, key=request.idempotency_key
            )
    except DatabaseUnavailable:
        if not writing:
            raise  # nothing was sent that could have written: plainly retryable
        return await _settle_unknown(engine, request, turn_id, fp)
    if winner is None:
        # The statement inserted nothing and no turn holds the key: the
        # session itself must be gone.
        return Admission(AdmissionOutcome.SESSION_NOT_FOUND)
    return _judge(winner, fp)


async def _settle_unknown(
    engine: Engine, request: TurnRequest, turn_id: uuid.UUID, fp: str
) -> Admission:
    log.warning(
        "admission outcome unknown; re-reading key on a fresh connection",
        extra={"session_id": str(request.session_id)},
    )
    try:
        async with connect(engine) as conn:
            existing = await db.turn_by_key(
                conn, session_id=request.session_id, key=request.idempotency_key
            )
    except DatabaseUnavailable:
        raise OutcomeUnknown() from None
    if existing is None:
        raise OutcomeUnknown()
    if existing.id == turn_id:
        return Admission(AdmissionOutcome.ACCEPTED, existing)
    return _judge(existing, fp)
