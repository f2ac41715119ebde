"""The export file's rows, without a database: a row is encoded by its
columns' types and decoded back to the same values; anything that is not
exactly a row of its table is refused naming the field; a file of version 1
carries every part but the keys; the progress line appears on a terminal
only."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from keyturn.db import transfer
from keyturn.errors import TransferRefused
from keyturn.ops.transfer import Moved, Progress, Transferred

TURN = next(p for p in transfer.PARTS if p.kind == "turn")
EVENT = next(p for p in transfer.PARTS if p.kind == "event")
KEY = next(p for p in transfer.PARTS if p.kind == "key")


def a_turn() -> dict[str, object]:
    now = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
    return {
        "id": uuid.uuid4(),
        "session_id": uuid.uuid4(),
        "idempotency_key": "k",
        "fingerprint": "f" * 64,
        "input": "héllo",
        "history": "FULL",
        "status": "COMPLETED",
        "output": "reply",
        "error": None,
        "admit_seq": 1,
        "created_at": now,
        "started_at": now,
        "completed_at": now + timedelta(seconds=1),
        "owner": "host:1:ab",
        "lease_until": None,
        "epoch": 1,
        "retry_of": None,
        "cancel_requested_at": None,
        "cancel_reason": None,
        "cancel_key": None,
        "cancel_fingerprint": None,
    }


def test_a_row_round_trips_through_its_encoding() -> None:
    row = a_turn()
    encoded = transfer.encode(TURN, row)
    assert encoded["id"] == str(row["id"])
    assert encoded["created_at"] == "2026-12-01T12:00:00.123456+00:00"
    assert transfer.decode(TURN, {"kind": "turn", **encoded}) == row


def test_a_turn_written_before_cancels_existed_reads_as_never_cancelled() -> None:
    row = a_turn()
    encoded = transfer.encode(TURN, row)
    older = {k: v for k, v in encoded.items() if not k.startswith("cancel_")}
    assert transfer.decode(TURN, {"kind": "turn", **older}) == row


def test_the_same_instant_in_another_zone_is_the_same_row() -> None:
    row = a_turn()
    encoded = transfer.encode(TURN, row)
    plus_two = row["created_at"].astimezone(timezone(timedelta(hours=2)))  # type: ignore[attr-defined]
    shifted = transfer.decode(TURN, {**encoded, "created_at": plus_two.isoformat()})
    assert transfer.canonical(TURN, shifted) == encoded


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"surprise": 1}, "surprise"),
        ({"epoch": "1"}, "epoch"),
        ({"epoch": True}, "epoch"),
        ({"id": "not-a-uuid"}, "id"),
        ({"created_at": "2026-12-01T12:00:00"}, "created_at"),
        ({"status": None}, "status"),
        ({"input": "a\x00b"}, "input"),
    ],
)
def test_anything_but_a_row_of_the_table_is_refused_naming_the_field(
    change: dict[str, object], named: str
) -> None:
    encoded = {**transfer.encode(TURN, a_turn()), **change}
    with pytest.raises(TransferRefused) as refused:
        transfer.decode(TURN, encoded)
    assert repr(named) in str(refused.value)


def test_a_missing_field_is_refused_and_an_event_carries_no_id() -> None:
    encoded = transfer.encode(TURN, a_turn())
    del encoded["fingerprint"]
    with pytest.raises(TransferRefused, match="'fingerprint'"):
        transfer.decode(TURN, encoded)
    assert "id" not in EVENT.columns and "seq" in EVENT.columns


def test_a_keys_kind_travels_beside_the_lines_kind() -> None:
    row = {
        "session_id": uuid.uuid4(),
        "idempotency_key": "stop it",
        "kind": "CANCEL",
        "turn_id": uuid.uuid4(),
    }
    encoded = transfer.encode(KEY, row)
    assert encoded["key_kind"] == "CANCEL" and "kind" not in encoded
    line = {"kind": "key", **encoded}
    assert transfer.decode(KEY, line) == row
    with pytest.raises(TransferRefused, match="'key_kind'"):
        transfer.decode(KEY, {**line, "key_kind": None})


def test_a_file_of_version_1_carries_every_part_but_the_keys() -> None:
    assert [p.kind for p in transfer.parts(1)] == ["turn", "event", "resolution", "tombstone"]
    assert transfer.parts(2) == transfer.PARTS and transfer.PARTS[-1] is KEY


def test_a_files_sessions_are_summed_per_part() -> None:
    one = Transferred(uuid.uuid4(), {"turn": 1, "event": 3, "key": 1})
    two = Transferred(uuid.uuid4(), {"turn": 2, "event": 5, "key": 2}, already_present=True)
    assert Moved([one, two]).describe() == "2 sessions, 3 turns, 8 events, 3 keys"
    assert one.describe() == "1 turn, 3 events, 1 key"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_is_drawn_on_a_terminal_only() -> None:
    terminal, pipe = Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        progress = Progress(stream, "exporting", every_s=0)
        progress.total = 3
        progress.advance(3)
        progress.finish()
    assert terminal.getvalue().endswith("\rexporting: 3/3 lines\n")
    assert pipe.getvalue() == ""


def test_a_line_given_up_is_ended_before_the_reason() -> None:
    drawn, quiet = Terminal(), Terminal()
    progress = Progress(drawn, "importing", every_s=0)
    progress.advance(2)
    progress.stop()
    Progress(quiet, "importing").stop()  # nothing drawn yet: nothing to end
    assert drawn.getvalue() == "\rimporting: 2 lines\n"
    assert quiet.getvalue() == ""
