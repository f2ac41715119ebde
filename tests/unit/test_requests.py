"""The request rules that need no database: validation and the fingerprint."""

from __future__ import annotations

import sys
import unicodedata
import uuid

import pytest

from keyturn.domain import History
from keyturn.errors import InvalidRequest
from keyturn.runtime.validation import CONTROL, TurnRequest, fingerprint

SID = str(uuid.uuid4())


def parse(**kw: object) -> TurnRequest:
    args: dict[str, object] = {
        "session_id": SID,
        "idempotency_key": "k",
        "input": "hi",
        "history": None,
    }
    args.update(kw)
    return TurnRequest.parse(**args)  # type: ignore[arg-type]


def test_fingerprint_is_of_the_effective_request() -> None:
    omitted = parse(history=None)
    explicit = parse(history=History.FULL)
    assert fingerprint(input="hi", history=omitted.effective_history(History.FULL)) == fingerprint(
        input="hi", history=explicit.effective_history(History.NONE)
    )
    assert fingerprint(input="hi", history=History.FULL) != fingerprint(
        input="hi", history=History.NONE
    )


@pytest.mark.parametrize("other", ["hi ", "Hi", "h\u0131", "hi\u200b", "\ufeffhi"])
def test_fingerprint_compares_input_byte_for_byte(other: str) -> None:
    assert fingerprint(input="hi", history=History.FULL) != fingerprint(
        input=other, history=History.FULL
    )


def test_fingerprint_has_no_ambiguous_boundary() -> None:
    # history and input are separated, so no input can imitate another history
    assert fingerprint(input="NONE", history=History.FULL) != fingerprint(
        input="FULL", history=History.NONE
    )


def test_a_lone_surrogate_is_invalid_input_not_a_crash() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(input="bad \ud800 text")
    assert caught.value.field == "input"


def test_a_key_is_refused_for_exactly_the_control_characters() -> None:
    # Every code point: refused in a key exactly when Unicode calls it a
    # control character (Cc), as unicodedata tells.
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        control = unicodedata.category(ch) == "Cc"
        assert (CONTROL.search(f"key{ch}key") is not None) is control, hex(code)
    for ch in ("\x00", "\n", "\x7f", "\x85", "\x9f"):
        with pytest.raises(InvalidRequest, match="control characters"):
            parse(idempotency_key=f"a{ch}b")
    for ch in (" ", "\xa0", "\u2028", "\ufeff", "é", "\U0001f600"):
        assert parse(idempotency_key=f"a{ch}b").idempotency_key == f"a{ch}b"
