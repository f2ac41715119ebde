"""The interruption experiment's verdicts for MCP tools of each kind, and
its MCP server's store (a SQLite file): what each judges by."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyturn.ops.experiment.judging import read_verdict, set_verdict
from keyturn.ops.experiment.sqlite_store import Store, Write


@pytest.mark.parametrize(
    ("state", "held", "expected"),
    [
        ("COMPLETED", "v", "agreed"),
        ("COMPLETED", None, "contradicted"),
        ("NOT_STARTED", None, "agreed"),
        ("NOT_STARTED", "v", "contradicted"),
        (None, "v", "contradicted"),
        ("OUTCOME_UNKNOWN", None, "uncertain"),
        ("OUTCOME_UNKNOWN", "v", "uncertain"),
        # The call's own name holds another value: whatever the record says.
        ("OUTCOME_UNKNOWN", "w", "contradicted"),
        ("COMPLETED", "w", "contradicted"),
    ],
)
def test_a_repeatable_set_is_judged_by_the_value_it_leaves(
    state: str | None, held: str | None, expected: str
) -> None:
    assert set_verdict(state, held, "v") == expected


@pytest.mark.parametrize(
    ("state", "read", "after", "expected"),
    [
        ("COMPLETED", "seeded", "seeded", "agreed"),
        ("COMPLETED", None, "seeded", "contradicted"),  # it read something else
        ("COMPLETED", "seeded", "other", "contradicted"),  # the store changed
        ("OUTCOME_UNKNOWN", None, "seeded", "uncertain"),
        ("OUTCOME_UNKNOWN", None, "other", "contradicted"),
        ("NOT_STARTED", None, "seeded", "agreed"),
        ("RECONCILED_APPLIED", None, "seeded", "contradicted"),  # nobody asks a read
    ],
)
def test_a_read_is_judged_by_what_it_read_and_an_unchanged_store(
    state: str, read: str | None, after: str, expected: str
) -> None:
    assert read_verdict(state, read=read, before="seeded", after=after) == expected


def test_the_store_applies_a_key_at_most_once_and_a_no_is_final(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.sqlite3")
    assert store.write("t/0", "a", "1") is Write.APPLIED
    assert store.write("t/0", "a", "2") is Write.ALREADY_APPLIED
    assert store.settle("t/0") is True
    # Asked before any write: settled as never applied, and it stays so.
    assert store.settle("t/1") is False
    assert store.write("t/1", "b", "1") is Write.SETTLED_NOT_APPLIED
    assert store.settle("t/1") is False
    assert store.applied_counts(["t/0", "t/1", "t/2"]) == {"t/0": 1, "t/1": 0, "t/2": 0}
    # A second opening of the file (the replacement's server) sees the same.
    assert Store(store.path).applied_counts(["t/0", "t/1"]) == {"t/0": 1, "t/1": 0}


def test_the_store_sets_values_and_counts_every_append(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.sqlite3")
    assert store.read("a") is None
    store.set("a", "1")
    store.set("a", "1")
    assert store.values(["a", "b"]) == {"a": "1", "b": None}
    store.append("c", "1")
    store.append("c", "1")
    assert store.append_counts(["c", "d"]) == {"c": 2, "d": 0}
