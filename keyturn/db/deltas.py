"""turn.delta: a running turn's output, recorded piece by piece as it streams.

One statement per delta, like those of :mod:`keyturn.db.leases`: it takes the
session row, then the turn's, fenced by the turn's epoch and status RUNNING;
it appends the event and keeps ``turns.output`` equal to the text recorded so
far. The last piece of a turn is not written here but with the turn's end
(:func:`keyturn.db.leases.finish_many`, a ``Finish`` with ``delta``), in the same commit. A unique
index allows one delta per index of an epoch, so a delta retried after a lost
connection cannot append twice.
"""

from __future__ import annotations

import uuid
from typing import Any

from keyturn.db.engine import Conn
from keyturn.db.failures import DRIVER_ERRORS, violated
from keyturn.db.leases import SESSION_OF_TURN
from keyturn.db.ledger import Appended
from keyturn.db.sql import Statement, append_event, literal
from keyturn.domain import EventType, TurnStatus

ONE_DELTA_PER_INDEX = "ux_events_turn_delta"

# Index 0 starts the output afresh: a turn handed back to the queue and
# claimed again streams anew under its new epoch.
_APPEND = Statement(
    f"""
    WITH {SESSION_OF_TURN}, u AS (
        UPDATE turns SET output = CASE WHEN CAST(:index AS int) = 0 THEN CAST(:text AS text)
                                       ELSE COALESCE(turns.output, '') || CAST(:text AS text)
                                  END
        FROM s
        WHERE turns.id = :turn_id AND turns.session_id = s.id
          AND turns.epoch = :epoch AND turns.status = {literal(TurnStatus.RUNNING)}
        RETURNING turns.id, turns.session_id
    ), {
        append_event(
            "u",
            type=literal(EventType.TURN_DELTA),
            data='''jsonb_build_object('text', CAST(:text AS text), 'index', CAST(:index AS int),
                                       'epoch', CAST(:epoch AS bigint))''',
        )
    }
    SELECT seq FROM ev
    """
)


def delta_data(*, text: str, index: int, epoch: int) -> dict[str, Any]:
    """A turn.delta's data, as :func:`append` writes it and the finish carries it."""
    return {"text": text, "index": index, "epoch": epoch}


async def append(conn: Conn, *, turn_id: uuid.UUID, epoch: int, index: int, text: str) -> Appended:
    """Record the piece ``index`` of a turn this caller runs under ``epoch``."""
    try:
        seq = await _APPEND.fetchval(conn, turn_id=turn_id, epoch=epoch, index=index, text=text)
    except DRIVER_ERRORS as error:
        if violated(error) == ONE_DELTA_PER_INDEX:
            return Appended.DUPLICATE
        raise
    return Appended.APPENDED if seq is not None else Appended.REFUSED
