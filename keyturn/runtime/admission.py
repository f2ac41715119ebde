"""Admission: which request is this — a new turn, the same one again, a
different request wrongly given a used key, or a key whose time is over?"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from enum import Enum

from keyturn.db import admission as db
from keyturn.db.admission import Expiry, KeyState
from keyturn.db.engine import Engine, connect
from keyturn.db.records import TurnRecord
from keyturn.domain import History, Multitask
from keyturn.errors import DatabaseBusy, DatabaseUnavailable, OutcomeUnknown
from keyturn.runtime.admitter import Admitter
from keyturn.runtime.stats import NoStats, Stats
from keyturn.runtime.validation import TurnRequest, fingerprint

log = logging.getLogger(__name__)


class AdmissionOutcome(Enum):
    ACCEPTED = "accepted"
    REPLAYED = "replayed"
    CONFLICT = "conflict"
    # The key's turn ended more than the key retention ago: the key is spent,
    # for this request or any other. A new turn needs a new key.
    EXPIRED = "expired"
    SESSION_NOT_FOUND = "session_not_found"
    # multitask REJECT while a turn of the session is queued or running:
    # nothing written; the same key is a new admission once the session is idle.
    BUSY = "busy"


@dataclass(frozen=True, slots=True)
class Admission:
    outcome: AdmissionOutcome
    turn: TurnRecord | None = None
    expiry: Expiry | None = None
    # CONFLICT with a key a decision took (a cancel, a resolution): its turn.
    conflicting_turn_id: uuid.UUID | None = None
    busy_turn_id: uuid.UUID | None = None  # BUSY: the turn that keeps the session busy
    # ACCEPTED under multitask INTERRUPT: the turns it cancelled or asked to stop.
    cancelled: tuple[TurnRecord, ...] = ()


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
    key_retention_s: int | None = None,
    admitter: Admitter | None = None,
) -> Admission:
    """Admit ``request`` (see ``_admit``), counted and logged. Inputs are the
    users' words: logged only with ``log_inputs``. New keys go out through
    ``admitter`` (the process's, which shares statements among concurrent
    submissions), or one made for this submission alone."""
    stats = stats or NoStats()
    started = time.perf_counter()
    try:
        admission = await _admit(
            engine=engine,
            admitter=admitter,
            request=request,
            tenant=tenant,
            key_retention_s=key_retention_s,
        )
    except DatabaseUnavailable:
        stats.admitted("unavailable", time.perf_counter() - started)
        log.warning("admission unavailable", extra=_fields(request, log_inputs))
        raise
    stats.admitted(admission.outcome.value, time.perf_counter() - started)
    if log.isEnabledFor(logging.INFO):  # the line's fields, only if written
        extra = _fields(request, log_inputs)
        if admission.turn is not None:
            extra["turn_id"] = str(admission.turn.id)
        elif admission.expiry is not None:
            extra["turn_id"] = str(admission.expiry.turn_id)
        log.info("admission %s", admission.outcome.value, extra=extra)
    return admission


def _fields(request: TurnRequest, log_inputs: bool) -> dict[str, object]:
    extra: dict[str, object] = {
        "session_id": str(request.session_id),
        "idempotency_key": request.idempotency_key,
    }
    if log_inputs:
        extra["input"] = request.input
    return extra


def _answer(key: KeyState, fp: str) -> Admission | None:
    """The answer a key already held gives, or None when it holds nothing.
    Expiry comes first: a spent key answers KeyExpired whatever is asked."""
    if key.expiry is not None:
        return Admission(AdmissionOutcome.EXPIRED, key.existing, key.expiry)
    if key.existing is not None:
        return _judge(key.existing, fp)
    if key.decided_turn_id is not None:
        return Admission(AdmissionOutcome.CONFLICT, conflicting_turn_id=key.decided_turn_id)
    return None


async def _admit(
    *,
    engine: Engine,
    admitter: Admitter | None,
    request: TurnRequest,
    tenant: str,
    key_retention_s: int | None,
    attempt: int = 0,
) -> Admission:
    """Admit ``request`` or say which turn already holds its key.

    A key that already names a turn is answered from one read (the lookup)
    and writes nothing: a replay is that one statement. Otherwise the
    admission statement tries to claim the key: under ENQUEUE sent at once,
    or shared with the session's other new keys that arrive while one of its
    statements is in flight (the ``admitter``), under REJECT and INTERRUPT
    one in a transaction of its own. When it loses a race, a
    separate read finds the winner. If the connection dies while the
    statement commits, the outcome is unknown: it is settled by reading the
    key again on a fresh connection, never guessed.
    """
    # Set just before the admission statement is sent: from then on its
    # outcome must be settled.
    turn_id: uuid.UUID | None = None
    fp = ""
    multitask = Multitask.ENQUEUE
    try:
        # One pooled connection for the lookup and the admission: a checkout
        # costs about as much as a short statement.
        async with connect(engine) as conn:
            found = await db.lookup(
                conn,
                tenant=tenant,
                session_id=request.session_id,
                key=request.idempotency_key,
                key_retention_s=key_retention_s,
            )
            if not found.session_found:
                return Admission(AdmissionOutcome.SESSION_NOT_FOUND)
            history = request.effective_history(found.default_history or History.FULL)
            multitask = request.effective_multitask(found.multitask)
            fp = fingerprint(input=request.input, history=history, multitask=multitask)
            held = _answer(found.key, fp)
            if held is not None:
                return held
            new = db.NewTurn(
                turn_id=uuid.uuid4(),
                tenant=tenant,
                session_id=request.session_id,
                key=request.idempotency_key,
                fingerprint=fp,
                input=request.input,
                history=history,
                data=_started_data(request.idempotency_key, history, multitask),
            )
            turn_id = new.turn_id
            waiting = None
            if multitask is not Multitask.ENQUEUE:
                admitted = await db.insert_turn(conn, new, multitask=multitask)
            else:
                admitter = admitter or Admitter(engine)
                waiting = admitter.join(new)
                if waiting is None:  # nothing of its session in flight: at once
                    admitted = db.Admitted(await admitter.send(conn, new))
        if waiting is not None:
            # Shares the session's next statement, its connection back in
            # the pool meanwhile (that statement takes one of its own).
            admitted = db.Admitted(await waiting)
        if admitted.turn is not None:
            return Admission(AdmissionOutcome.ACCEPTED, admitted.turn, cancelled=admitted.cancelled)
        # Another submission won the key, or a tombstone holds it, or
        # (REJECT) the session is busy.
        async with connect(engine) as conn:
            winner = await db.key_state(
                conn,
                session_id=request.session_id,
                key=request.idempotency_key,
                key_retention_s=key_retention_s,
            )
            busy = (
                await db.busy_turn(conn, session_id=request.session_id)
                if multitask is Multitask.REJECT and _answer(winner, fp) is None
                else None
            )
    except DatabaseBusy:
        raise  # refused before anything committed (keyturn.db.failures.is_busy)
    except DatabaseUnavailable:
        if turn_id is None:
            raise  # nothing was sent that could have written: plainly retryable
        return await _settle_unknown(engine, request, tenant, turn_id, key_retention_s)
    answer = _answer(winner, fp)
    if answer is None and busy is not None:
        return Admission(AdmissionOutcome.BUSY, busy_turn_id=busy)
    if answer is None and multitask is Multitask.REJECT and attempt < 3:
        # The busy turn ended between the statement and the read: admit again.
        return await _admit(
            engine=engine,
            admitter=admitter,
            request=request,
            tenant=tenant,
            key_retention_s=key_retention_s,
            attempt=attempt + 1,
        )
    if answer is None:
        # The statement inserted nothing and nothing holds the key: the
        # session itself must be gone.
        return Admission(AdmissionOutcome.SESSION_NOT_FOUND)
    return answer


def _started_data(key: str, history: History, multitask: Multitask) -> dict[str, object]:
    data: dict[str, object] = {"idempotencyKey": key, "history": history}
    if multitask is not Multitask.ENQUEUE:
        data["multitask"] = multitask
    return data


async def _settle_unknown(
    engine: Engine,
    request: TurnRequest,
    tenant: str,
    turn_id: uuid.UUID,
    key_retention_s: int | None,
) -> Admission:
    """The answer to a statement whose outcome was lost, read from the record
    on a fresh connection: our turn, or what else holds the key, judged as
    the statement would have (the session's defaults read again)."""
    log.warning(
        "admission outcome unknown; re-reading key on a fresh connection",
        extra={"session_id": str(request.session_id)},
    )
    try:
        async with connect(engine) as conn:
            found = await db.lookup(
                conn,
                tenant=tenant,
                session_id=request.session_id,
                key=request.idempotency_key,
                key_retention_s=key_retention_s,
            )
    except DatabaseUnavailable:
        raise OutcomeUnknown() from None
    held = found.key
    if held.existing is not None and held.existing.id == turn_id:
        return Admission(AdmissionOutcome.ACCEPTED, held.existing)
    if not found.session_found:
        raise OutcomeUnknown()  # gone since: whether it had admitted is lost with it
    history = request.effective_history(found.default_history or History.FULL)
    multitask = request.effective_multitask(found.multitask)
    answer = _answer(held, fingerprint(input=request.input, history=history, multitask=multitask))
    if answer is None:
        raise OutcomeUnknown()
    return answer
