"""One write of a running turn, fenced by its epoch.

Every write a running turn makes to its record (a ledger entry, a delta)
names the epoch its claim gave it; a write under an epoch that has passed
on is refused, and the refusal itself is recorded (``turn.write_refused``).
A lost connection is retried for as long as the lease could hold: the
ledger's and the deltas' unique indexes make a repeat harmless.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from keyturn.db import leases
from keyturn.db.engine import Conn, Engine, connect
from keyturn.db.ledger import Appended
from keyturn.db.records import TurnRecord
from keyturn.domain import EventType
from keyturn.errors import DatabaseUnavailable, StaleLease
from keyturn.runtime.bus import EventBus

log = logging.getLogger(__name__)

RETRY_S = 0.5


async def append_fenced(
    *,
    engine: Engine,
    bus: EventBus,
    turn: TurnRecord,
    owner: str,
    lease_ttl_s: float,
    attempted: EventType,
    write: Callable[[Conn], Awaitable[Appended]],
) -> None:
    """Run ``write`` (which appends ``attempted`` under the turn's epoch).
    Raises StaleLease when the record refused it, DatabaseUnavailable when
    the database did not answer for as long as the lease could hold."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + lease_ttl_s
    while True:
        try:
            async with connect(engine) as conn:
                done = await write(conn)
                if done is Appended.REFUSED:
                    await leases.record_refused_write(
                        conn, turn_id=turn.id, epoch=turn.epoch, attempted=attempted, by=owner
                    )
            break
        except DatabaseUnavailable:
            if loop.time() > deadline:
                raise
            log.warning("turn %s: recording %s failed; will retry", turn.id, attempted)
            await asyncio.sleep(RETRY_S)
    bus.committed(turn.session_id)
    if done is Appended.REFUSED:
        log.warning("turn %s: %s refused, epoch %s is stale", turn.id, attempted, turn.epoch)
        raise StaleLease()
