from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from keyturn.errors import InvalidArgument
from keyturn.resolvers.pagination import (
    check_first,
    decode_seq_cursor,
    decode_session_cursor,
    seq_cursor,
    session_cursor,
)


def test_cursors_round_trip_and_are_kind_checked() -> None:
    assert decode_seq_cursor("event", seq_cursor("event", 42)) == 42
    with pytest.raises(InvalidArgument):
        decode_seq_cursor("turn", seq_cursor("event", 42))
    now, sid = datetime.now(UTC), uuid.uuid4()
    assert decode_session_cursor(session_cursor(now, sid)) == (now, sid)


@pytest.mark.parametrize("bad", ["", "!!!", "ZXZlbnQ6LTE", "dHVybjp4"])
def test_garbage_cursors_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        decode_seq_cursor("event", bad)


def test_first_bounds() -> None:
    assert check_first(0) == 0 and check_first(100) == 100
    for bad in (-1, 101):
        with pytest.raises(InvalidArgument):
            check_first(bad)
