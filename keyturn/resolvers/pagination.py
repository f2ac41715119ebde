"""Relay-style paging (the cursor connections spec): opaque cursors, forward
with ``first``/``after`` or backward with ``last``/``before``, counts checked
(never silently clamped)."""

from __future__ import annotations

import base64
import uuid
from binascii import b2a_base64
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from keyturn.errors import InvalidArgument

MAX_FIRST = 100
# Turn.events without ``first`` answers every event of the turn, up to this
# many; a turn with more is refused rather than cut short (ask in pages).
MAX_UNPAGED_TURN_EVENTS = MAX_FIRST
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    cursors: list[str]
    has_next: bool
    total: int
    has_previous: bool = False


def check_first(first: int, name: str = "first") -> int:
    if first < 0:
        raise InvalidArgument(f"{name} must not be negative")
    if first > MAX_FIRST:
        raise InvalidArgument(f"{name} must be at most {MAX_FIRST} (got {first})")
    return first


@dataclass(frozen=True, slots=True)
class SeqWindow:
    """Which part of a seq-ordered list a page asks for."""

    backward: bool
    cursor: int | None  # after (forward) or before (backward); None: from the start or end
    limit: int


def seq_window(
    kind: str,
    *,
    first: int | None,
    after: str | None,
    last: int | None,
    before: str | None,
    default: int,
) -> SeqWindow:
    if last is None and before is None:
        count = default if first is None else first
        return SeqWindow(
            False, decode_seq_cursor(kind, after) if after else None, check_first(count)
        )
    if first is not None or after is not None:
        raise InvalidArgument(
            "page forward with first/after or backward with last/before, not both at once"
        )
    count = default if last is None else last
    return SeqWindow(
        True,
        decode_seq_cursor(kind, before, "before") if before else None,
        check_first(count, "last"),
    )


# base64.urlsafe_b64encode in one step: a page of 100 events encodes 100 cursors.
_URL_SAFE = bytes.maketrans(b"+/", b"-_")


def _encode(raw: str) -> str:
    return b2a_base64(raw.encode(), newline=False).translate(_URL_SAFE).rstrip(b"=").decode()


def _decode(cursor: str, name: str = "after") -> str:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return base64.urlsafe_b64decode(padded.encode()).decode()
    except (ValueError, UnicodeError):
        raise InvalidArgument(f"{name} is not a cursor this API gave out") from None


def seq_cursors(kind: str, seqs: Iterable[int]) -> list[str]:
    """The cursor of each seq (its ``kind:seq`` text, URL-safe base64 without
    padding), made in one call for a whole page."""
    encode, url_safe = b2a_base64, _URL_SAFE
    head = f"{kind}:".encode()
    if len(head) % 3:
        return [
            encode(head + b"%d" % seq, newline=False).translate(url_safe).rstrip(b"=").decode()
            for seq in seqs
        ]
    # A prefix of whole 3-byte groups ("event:") encodes apart from what
    # follows it: its text once, then only each seq's digits.
    start = _encode(head.decode())
    return [
        start + encode(b"%d" % seq, newline=False).translate(url_safe).rstrip(b"=").decode()
        for seq in seqs
    ]


def _whole_number(text: str) -> bool:
    """ASCII digits of a number below 2**63, as a seq or an event's id is
    (str.isdigit also takes "³"; int() refuses more than 4,300 digits)."""
    return text.isascii() and text.isdigit() and len(text) <= 19 and int(text) < 2**63


def decode_seq_cursor(kind: str, cursor: str | None, name: str = "after") -> int:
    if cursor is None:
        return 0
    raw = _decode(cursor, name)
    prefix, _, value = raw.partition(":")
    if prefix != kind or not _whole_number(value):
        raise InvalidArgument(f"{name} is not a cursor this API gave out")
    return int(value)


def session_cursor(created_at: datetime, session_id: uuid.UUID) -> str:
    return _encode(f"session:{created_at.isoformat()}|{session_id}")


def decode_session_cursor(cursor: str | None) -> tuple[datetime, uuid.UUID] | None:
    if cursor is None:
        return None
    raw = _decode(cursor)
    prefix, _, value = raw.partition(":")
    ts, _, sid = value.partition("|")
    try:
        if prefix != "session":
            raise ValueError
        return datetime.fromisoformat(ts), uuid.UUID(sid)
    except ValueError:
        raise InvalidArgument("after is not a cursor this API gave out") from None
