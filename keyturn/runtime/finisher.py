"""The ends of running turns, written together: one statement for every turn
of this process that finished while the previous one was in flight.

A finish that arrives while no statement is in flight goes out at once, so a
lone turn waits for nothing; under load, the turns that end during one round
trip share the next. Each row keeps its own epoch fence inside the batch, and
each caller learns its own outcome: True when its turn ended, False when its
fence failed. A statement that failed (its answer lost, the database gone)
fails for every caller in it, who settles it from the record as a single
finish would (:meth:`keyturn.runtime.worker.Worker._finish`).
"""

from __future__ import annotations

import asyncio

from keyturn.db import leases
from keyturn.db.engine import Engine, connect

# A process runs at most ``max_running_turns`` turns, so batches are bounded
# by that already; this bounds the statement's size whatever it is set to.
MAX_BATCH = 128


class Finisher:
    def __init__(self, engine: Engine, *, max_batch: int = MAX_BATCH) -> None:
        self._engine = engine
        self._max_batch = max_batch
        self._pending: list[tuple[leases.Finish, asyncio.Future[bool]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.statements = 0
        self.finished = 0

    async def finish(self, request: leases.Finish) -> bool:
        """Whether the turn ended: False when its epoch or status no longer
        matched. Raises what the statement raised (DatabaseUnavailable when
        its outcome is unknown)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="keyturn-finisher")
        return await future

    async def _flush(self) -> None:
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            # A caller cancelled while it waited (a shutdown past its grace)
            # hands its turn back instead: its end is not written.
            batch = [(r, f) for r, f in batch if not f.done()]
            if not batch:
                continue
            try:
                async with connect(self._engine) as conn:
                    done = await leases.finish_many(conn, [r for r, _ in batch])
            except Exception as error:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            except asyncio.CancelledError:
                for _, future in batch:
                    future.cancel()
                raise
            self.statements += 1
            self.finished += len(done)
            for request, future in batch:
                if not future.done():
                    future.set_result(request.turn_id in done)
