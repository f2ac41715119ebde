"""New keys' turns, admitted together: one statement for every submission of
this process whose key was new while the statements before it were in
flight.

A submission that arrives while fewer than ``max_in_flight`` statements are
in flight goes out at once, so a lone submission waits for nothing; under
load, the ones that arrive during a round trip share the next statement, its
transaction and its commit. That statement does per row what a lone one
does (keyturn.db.admission): each key judged by its own primary key, each
session's seqs gapless in commit order, its sessions locked in id order, so
two such statements never deadlock. The commit that answers one caller
answers all of them: nobody is answered before their turn is durable.

The shared statement never waits for a session another transaction holds
(a turn's end, a claim, another admission): it leaves that row out, and the
row is sent again alone, waiting for its session as a lone submission
would. Waiting in the shared statement would make every row of it wait, in
turn, for every writer of any of its sessions (measured: the p99 of a
submission at half of peak load went from 27 to 109 ms).

A statement whose answer is lost fails for every caller in it, and each
settles it from the record as a lone admission would (by its key, on a fresh
connection). A statement refused for another reason is tried again row by
row, so that one row the database refuses fails only its own caller.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Sequence

from keyturn.db import admission as db
from keyturn.db.engine import Engine, connect
from keyturn.db.records import TurnRecord
from keyturn.errors import DatabaseUnavailable

# Bounds the statement's size (its arrays) whatever the load.
MAX_BATCH = 128
# Two statements at once: a statement waiting on one of its sessions (held
# by a turn's end, say) does not hold every other submission of the process
# behind it.
MAX_IN_FLIGHT = 2

_Pending = tuple[db.NewTurn, "asyncio.Future[TurnRecord | None]"]


class Admitter:
    def __init__(
        self, engine: Engine, *, max_batch: int = MAX_BATCH, max_in_flight: int = MAX_IN_FLIGHT
    ) -> None:
        self._engine = engine
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._pending: list[_Pending] = []
        self._in_flight = 0
        self._flushers: set[asyncio.Task[None]] = set()
        self.statements = 0
        self.admitted = 0

    async def admit(self, new: db.NewTurn) -> TurnRecord | None:
        """The admitted turn, or None when its key was taken first (or its
        session is gone). Raises what the statement raised
        (DatabaseUnavailable when its outcome is unknown)."""
        future: asyncio.Future[TurnRecord | None] = asyncio.get_running_loop().create_future()
        self._pending.append((new, future))
        if self._in_flight < self._max_in_flight:
            self._in_flight += 1
            # A context of its own: the statement is no one caller's, and its
            # connection is not charged to the first caller's tenant share.
            task = asyncio.create_task(
                self._flush(), name="keyturn-admitter", context=contextvars.Context()
            )
            self._flushers.add(task)
            task.add_done_callback(self._flushers.discard)
        turn = await future
        if turn is not None:
            return turn
        # Left out of the shared statement: its session was held by another
        # writer at that moment (the shared statement does not wait for
        # it), or its key was taken, or its session is gone. Alone, waiting
        # for the session as a lone submission does, the statement says.
        async with connect(self._engine) as conn:
            return (await db.admit_many(conn, [new])).get(new.turn_id)

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                # A caller cancelled while it waited (its client gone, a
                # shutdown): nothing of its turn is written.
                batch = [(n, f) for n, f in batch if not f.done()]
                if batch:
                    await self._send(batch)
        finally:
            self._in_flight -= 1

    async def _send(self, batch: Sequence[_Pending]) -> None:
        try:
            async with connect(self._engine) as conn:
                done = await db.admit_many(conn, [n for n, _ in batch], skip_held=True)
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except DatabaseUnavailable as error:  # DatabaseBusy too: refused before it ran
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        except Exception as error:
            if len(batch) > 1:
                # Refused whole, so nothing of it was written: each row alone.
                for one in batch:
                    await self._send([one])
                return
            if not batch[0][1].done():
                batch[0][1].set_exception(error)
            return
        self.statements += 1
        self.admitted += len(done)
        for new, future in batch:
            if not future.done():
                future.set_result(done.get(new.turn_id))
