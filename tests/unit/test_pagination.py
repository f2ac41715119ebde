from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime

import pytest

from keyturn.errors import InvalidArgument
from keyturn.resolvers.pagination import (
    check_first,
    decode_seq_cursor,
    decode_session_cursor,
    seq_cursors,
    session_cursor,
)


def test_cursors_round_trip_and_are_kind_checked() -> None:
    assert decode_seq_cursor("event", seq_cursors("event", [42])[0]) == 42
    with pytest.raises(InvalidArgument):
        decode_seq_cursor("turn", seq_cursors("event", [42])[0])
    now, sid = datetime.now(UTC), uuid.uuid4()
    assert decode_session_cursor(session_cursor(now, sid)) == (now, sid)


@pytest.mark.parametrize("kind", ["event", "turn", "session", "ab"])
def test_a_page_of_cursors_is_url_safe_base64_of_each_seq(kind: str) -> None:
    # Every length of seq, so every padding; kinds whose "kind:" prefix is
    # and is not whole base64 groups (encoded apart from the digits, or not).
    seqs = [*range(0, 2000), 2**31, 2**63 - 1]
    made = seq_cursors(kind, seqs)
    assert made == [
        base64.urlsafe_b64encode(f"{kind}:{s}".encode()).decode().rstrip("=") for s in seqs
    ]
    assert [decode_seq_cursor(kind, c) for c in made] == seqs


@pytest.mark.parametrize("bad", ["", "!!!", "ZXZlbnQ6LTE", "dHVybjp4"])
def test_garbage_cursors_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        decode_seq_cursor("event", bad)


def test_first_bounds() -> None:
    assert check_first(0) == 0 and check_first(100) == 100
    for bad in (-1, 101):
        with pytest.raises(InvalidArgument):
            check_first(bad)
