"""New keys' turns, admitted together: one statement for every submission to
a session whose key was new while that session's statement before it was in
flight.

Submissions to one session queue on its row whatever happens (its seqs are
handed out in commit order), so while one statement of a session is in
flight, the submissions to that session that arrive meanwhile wait for the
next, and share it, its transaction and its commit. A submission to a
session with nothing in flight goes out at once, on its caller's connection:
a lone submission waits for nothing and costs what it did alone, and
submissions to different sessions never wait for each other.
The statement does per row what a lone one does (keyturn.db.admission):
each key judged by its own primary key, the session's seqs gapless in
commit order. The commit that answers one caller answers all of them:
nobody is answered before their turn is durable.

One session per statement, not every session with something pending: a
statement waits for each of its sessions' other writers in turn (a turn's
end, a claim), and every row of it with them (measured in a full run of
``make bench``: the p99 of a submission at half of peak load went from 27
to 109 ms with statements shared across sessions).

A statement whose answer is lost fails for every caller in it, and each
settles it from the record as a lone admission would (by its key, on a fresh
connection). A statement refused for another reason is tried again row by
row, so that one row the database refuses fails only its own caller.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from keyturn.db import admission as db
from keyturn.db.engine import Conn, Engine, connect
from keyturn.db.records import TurnRecord
from keyturn.errors import DatabaseUnavailable

# Bounds the statement's size (its arrays) whatever the load.
MAX_BATCH = 128

_Pending = tuple[db.NewTurn, "asyncio.Future[TurnRecord | None]"]


class Admitter:
    def __init__(self, engine: Engine, *, max_batch: int = MAX_BATCH) -> None:
        self._engine = engine
        self._max_batch = max_batch
        # By session: the submissions waiting for its next statement. A
        # session is here while a statement of it is in flight (a caller's,
        # then its flusher's, until none is left waiting).
        self._pending: dict[uuid.UUID, list[_Pending]] = {}
        self._flushers: set[asyncio.Task[None]] = set()
        self.statements = 0
        self.admitted = 0

    def join(self, new: db.NewTurn) -> asyncio.Future[TurnRecord | None] | None:
        """Where ``new`` goes: None when nothing of its session is in flight,
        and then the caller sends it at once with :meth:`send` on its own
        connection (a lone submission costs what it did alone); else the
        answer of the session's next statement, to be awaited with no
        connection held (the statement takes one of its own)."""
        pending = self._pending.get(new.session_id)
        if pending is None:
            # In flight from here: those that arrive meanwhile wait in the list.
            self._pending[new.session_id] = []
            return None
        future: asyncio.Future[TurnRecord | None] = asyncio.get_running_loop().create_future()
        pending.append((new, future))
        return future

    async def send(self, conn: Conn, new: db.NewTurn) -> TurnRecord | None:
        """Admit ``new`` (that :meth:`join` sent here) on ``conn``: the
        turn, or None when its key was taken first (or its session is
        gone). Raises what the statement raised (DatabaseUnavailable when
        its outcome is unknown)."""
        try:
            done = await db.admit_many(conn, [new])
        finally:
            if self._pending[new.session_id]:
                # In the caller's context: the statement's connection is
                # charged to the session's tenant, as the caller's own is.
                task = asyncio.create_task(
                    self._flush(new.session_id), name=f"keyturn-admit-{new.session_id}"
                )
                self._flushers.add(task)
                task.add_done_callback(self._flushers.discard)
            else:
                del self._pending[new.session_id]
        self.statements += 1
        self.admitted += len(done)
        return done.get(new.turn_id)

    async def admit(self, new: db.NewTurn) -> TurnRecord | None:
        """:meth:`join`, then :meth:`send` on a connection of the
        admitter's pool or the wait, for a caller that holds none."""
        waiting = self.join(new)
        if waiting is not None:
            return await waiting
        async with connect(self._engine) as conn:
            return await self.send(conn, new)

    async def _flush(self, session_id: uuid.UUID) -> None:
        pending = self._pending[session_id]
        try:
            while pending:
                batch = pending[: self._max_batch]
                del pending[: self._max_batch]
                # A caller cancelled while it waited (its client gone, a
                # shutdown): nothing of its turn is written.
                batch = [(n, f) for n, f in batch if not f.done()]
                if batch:
                    await self._send(batch)
        finally:
            del self._pending[session_id]
            for _, future in pending:  # only if this task itself was cancelled
                future.cancel()

    async def _send(self, batch: Sequence[_Pending]) -> None:
        try:
            async with connect(self._engine) as conn:
                done = await db.admit_many(conn, [n for n, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except DatabaseUnavailable as error:
            # Its answer lost (each caller settles by its key) or, as
            # DatabaseBusy, refused before it ran.
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
