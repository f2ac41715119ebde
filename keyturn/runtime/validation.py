"""Checking what a client asks for before anything is written: a submission's
fields, with its defaults resolved and its fingerprint, and the shared checks
(ids, keys) that every keyed decision uses."""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass

from keyturn.domain import History, Multitask
from keyturn.errors import InvalidRequest

MAX_KEY_CHARS = 255
MAX_INPUT_BYTES = 64 * 1024
# Unicode's control characters (category Cc): C0, DEL and C1. One search of
# the key in C, where asking unicodedata for each character's category was a
# fiftieth of a replayed submitTurn.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def parse_uuid(value: str, *, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise InvalidRequest(field, f"{field} must be a UUID") from None


def _utf8(value: str, field: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(field, f"{field} is not valid Unicode text") from None


def check_key(key: str) -> None:
    if key == "":
        raise InvalidRequest("idempotencyKey", "idempotencyKey must not be empty")
    if len(key) > MAX_KEY_CHARS:
        raise InvalidRequest(
            "idempotencyKey", f"idempotencyKey must be at most {MAX_KEY_CHARS} characters"
        )
    _utf8(key, "idempotencyKey")
    if CONTROL.search(key) is not None:
        raise InvalidRequest("idempotencyKey", "idempotencyKey must not contain control characters")


def check_input(text: str) -> bytes:
    if text == "":
        raise InvalidRequest("input", "input must not be empty")
    raw = _utf8(text, "input")
    if len(raw) > MAX_INPUT_BYTES:
        raise InvalidRequest(
            "input", f"input must be at most {MAX_INPUT_BYTES} bytes of UTF-8 (got {len(raw)})"
        )
    if "\x00" in text:
        # PostgreSQL text cannot hold NUL; refusing beats silently altering it.
        raise InvalidRequest("input", "input must not contain the NUL character")
    return raw


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """A submission as the client sent it; ``history`` and ``multitask`` None
    mean "the session's setting"."""

    session_id: uuid.UUID
    idempotency_key: str
    input: str
    history: History | None
    multitask: Multitask | None = None

    @classmethod
    def parse(
        cls,
        *,
        session_id: str,
        idempotency_key: str,
        input: str,
        history: History | None,
        multitask: Multitask | None = None,
    ) -> TurnRequest:
        sid = parse_uuid(session_id, field="sessionId")
        check_key(idempotency_key)
        check_input(input)
        return cls(sid, idempotency_key, input, history, multitask)

    def effective_history(self, default: History) -> History:
        return self.history if self.history is not None else default

    def effective_multitask(self, default: Multitask) -> Multitask:
        return self.multitask if self.multitask is not None else default


def fingerprint(*, input: str, history: History, multitask: Multitask = Multitask.ENQUEUE) -> str:
    """Hash of the effective request. The input's exact UTF-8 bytes go in:
    no trimming, no Unicode normalisation, so any byte of difference is a
    different request."""
    digest = hashlib.sha256()
    digest.update(b"keyturn/turn/v1\x00")
    digest.update(history.value.encode())
    digest.update(b"\x00")
    digest.update(input.encode("utf-8"))
    # The policy goes in only when it is not ENQUEUE, the behaviour every key
    # admitted before there was a policy had: their fingerprints stay as they
    # were, so those keys still replay.
    if multitask is not Multitask.ENQUEUE:
        digest.update(b"\x00multitask\x00")
        digest.update(multitask.value.encode())
    return digest.hexdigest()
