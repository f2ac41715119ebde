"""The records the runtime reads have exactly their tables' columns, so the
generated SELECT lists and the records cannot drift apart."""

from __future__ import annotations

from typing import Any

import pytest
from sqlmodel import SQLModel

from keyturn.db.records import (
    EventRecord,
    ResolutionRecord,
    SessionRecord,
    TurnRecord,
    names,
    session_from,
    turn_from,
)
from keyturn.db.sql import Statement, columns
from keyturn.db.tables import Event, Resolution, Session, Turn
from keyturn.domain import History, Multitask, TurnStatus


@pytest.mark.parametrize(
    ("table", "record"),
    [
        (Session, SessionRecord),
        (Turn, TurnRecord),
        (Event, EventRecord),
        (Resolution, ResolutionRecord),
    ],
)
def test_a_record_has_its_tables_columns(table: type[SQLModel], record: type[Any]) -> None:
    table_columns = {c.name for c in table.__table__.columns}  # type: ignore[attr-defined]
    assert set(names(record)) == table_columns


def test_select_lists_come_from_the_table() -> None:
    assert columns(Event) == "id, session_id, turn_id, seq, type, data, created_at"
    assert columns(Event, alias="e", prefix="e_").startswith("e.id AS e_id, e.session_id AS")


def test_statement_numbers_named_parameters_once_each() -> None:
    s = Statement("SELECT :a, :b, :a::text, ':not_a_param', x::int FROM t WHERE y = :b")
    assert s.sql == "SELECT $1, $2, $1::text, ':not_a_param', x::int FROM t WHERE y = $2"
    assert s.names == ("a", "b")


def test_an_apostrophe_in_a_comment_opens_no_literal() -> None:
    s = Statement("SELECT :a -- the turn's key\nFROM t WHERE y = :b AND z = 'x:y'")
    assert s.sql == "SELECT $1 -- the turn's key\nFROM t WHERE y = $2 AND z = 'x:y'"
    assert s.names == ("a", "b")


def test_a_row_read_with_or_without_a_prefix_gives_each_field_its_column() -> None:
    """Fields are read by position: every value must land in its own field,
    the enums as their members, and a value no member has still refused."""
    turn: dict[str, Any] = {n: f"{n}-value" for n in names(TurnRecord)}
    turn |= {"history": "FULL", "status": "RUNNING", "admit_seq": 3, "epoch": 2}
    session: dict[str, Any] = {n: f"{n}-value" for n in names(SessionRecord)}
    session |= {"default_history": "NONE", "multitask": "REJECT", "event_seq": 9}
    for prefix in ("", "t_"):
        read = turn_from({prefix + k: v for k, v in turn.items()}, prefix=prefix)
        assert read == TurnRecord(**{**turn, "history": History.FULL, "status": TurnStatus.RUNNING})
        got = session_from({prefix + k: v for k, v in session.items()}, prefix=prefix)
        assert got == SessionRecord(
            **{**session, "default_history": History.NONE, "multitask": Multitask.REJECT}
        )
    with pytest.raises(ValueError):
        turn_from({**turn, "status": "SIDEWAYS"})
