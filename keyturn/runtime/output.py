"""A turn's output as its model produces it, recorded while it streams.

The model streams pieces of text through :meth:`Output.write`; the turn's
output is their concatenation, in order. Pieces are recorded as
``turn.delta`` events (through ``record``, a :class:`DeltaRecorder` in a
running turn), coalesced: text waits one flush interval after it arrives, so
a turn writes at most one delta per interval, and a reply produced in one
piece is not written here at all. :meth:`flush` is awaited once the reply is
done (or the model failed); what is still unrecorded then is
:attr:`Output.unrecorded`, the last delta, which the turn's end writes in its
own statement and commit.

So the deltas of a turn, in seq order, concatenate to its output.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from keyturn.db import deltas
from keyturn.db.engine import Conn, Engine
from keyturn.db.ledger import Appended
from keyturn.db.records import TurnRecord
from keyturn.domain import EventType
from keyturn.runtime.bus import EventBus
from keyturn.runtime.cancel import CancelSignal
from keyturn.runtime.fenced import append_fenced

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delta:
    """One recorded piece of a turn's output: its place (0, 1, 2 … in the
    turn's epoch) and its text."""

    index: int
    text: str


Record = Callable[[Delta], Awaitable[None]]


class Output:
    def __init__(
        self,
        *,
        record: Record | None = None,
        flush_interval_s: float = 0.1,
        cancel: CancelSignal | None = None,
    ) -> None:
        # Between two pieces of the stream is a safe point to stop at.
        self._cancel = cancel
        self._parts: list[str] = []
        self._length = 0
        self._record = record
        self._interval = flush_interval_s
        self._pending: list[str] = []  # written, not yet recorded
        self._index = 0  # the next delta's
        # The interval's wait before the next delta is a timer, not a task:
        # a reply produced within it (the whole reply at once, say) cancels
        # a handle and never makes a task. Once it fires, ``_writer`` records
        # the deltas, one per interval, while text keeps coming.
        self._due: asyncio.TimerHandle | None = None
        self._writer: asyncio.Task[None] | None = None
        self._writing = False  # the writer is inside ``record``
        self._flushed = False
        self._failure: BaseException | None = None

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def length(self) -> int:
        """Characters produced so far."""
        return self._length

    @property
    def unrecorded(self) -> Delta | None:
        """After :meth:`flush`: the text no delta holds yet, as the turn's last delta."""
        if self._record is None or not self._pending:
            return None
        return Delta(self._index, "".join(self._pending))

    def resume(self, text: str, *, next_index: int) -> None:
        """A turn resumed from its record (after a decision on a tool call):
        ``text`` is what its deltas already hold. New deltas number on from
        ``next_index``, so that none starts the output afresh as a delta 0
        does. Before anything is written."""
        self._parts = [text] if text else []
        self._length = len(text)
        self._index = next_index

    async def record_rest(self) -> None:
        """After :meth:`flush`: record the text no delta holds yet, now, as a
        turn that stops to wait for a decision must."""
        rest = self.unrecorded
        if rest is None or self._record is None:
            return
        await self._record(rest)
        self._pending.clear()
        self._index += 1

    async def write(self, text: str) -> None:
        """The model's ``emit``. Raises what stopped the recording (StaleLease:
        the turn's lease passed on; CancelRequested: the turn's cancel was
        asked for, and this piece is not part of its output), which ends the
        model's work."""
        self._raise_failure()
        if self._cancel is not None:
            self._cancel.check()
        if not text:
            return
        self._parts.append(text)
        self._length += len(text)
        if self._record is None:
            return
        self._pending.append(text)
        if self._due is None and self._writer is None and not self._flushed:
            loop = asyncio.get_running_loop()
            self._due = loop.call_later(self._interval, self._start_writer)

    async def flush(self) -> None:
        """The reply is done: no more timed writes (one in flight is waited
        for). Raises what stopped the recording, if anything did."""
        self._flushed = True
        self._cancel_due()
        writer = self._writer
        if writer is not None:
            # Between two deltas the writer is cancelled at its wait, where
            # it records nothing more; inside one, that delta is let finish.
            if not self._writing:
                writer.cancel()
            await asyncio.wait([writer])
            # A cancelled writer keeps its CancelledError, whose traceback
            # holds the frame that holds this object: let go of it, so the
            # turn's output is freed when the turn ends (not by the collector).
            self._writer = None
        self._raise_failure()

    def abandon(self) -> None:
        """The turn is no longer this process's to write: stop recording."""
        self._flushed = True
        self._cancel_due()
        if self._writer is not None:
            self._writer.cancel()

    def _cancel_due(self) -> None:
        if self._due is not None:
            self._due.cancel()
            self._due = None

    def _start_writer(self) -> None:
        self._due = None
        if not self._flushed:
            self._writer = asyncio.create_task(self._record_pending(), name="keyturn-output")

    async def _record_pending(self) -> None:
        """The deltas, one an interval, until no text is pending."""
        assert self._record is not None
        try:
            while True:
                count = len(self._pending)
                self._writing = True
                try:
                    await self._record(Delta(self._index, "".join(self._pending[:count])))
                finally:
                    self._writing = False
                # Text written while the delta was being recorded stays pending.
                del self._pending[:count]
                self._index += 1
                if not self._pending or self._flushed:
                    # Nothing to wait for: a flush that waits on this delta
                    # goes on at once, and later text arms a new interval.
                    break
                await asyncio.sleep(self._interval)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._failure = error
        finally:
            self._writer = None

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure


class DeltaRecorder:
    """Records one running turn's deltas from the worker's pool, fenced by its
    epoch like every write of the turn."""

    def __init__(
        self, *, engine: Engine, bus: EventBus, turn: TurnRecord, owner: str, lease_ttl_s: float
    ) -> None:
        self.engine = engine
        self.bus = bus
        self.turn = turn
        self.owner = owner
        self.lease_ttl_s = lease_ttl_s

    async def __call__(self, delta: Delta) -> None:
        turn = self.turn

        async def write(conn: Conn) -> Appended:
            return await deltas.append(
                conn, turn_id=turn.id, epoch=turn.epoch, index=delta.index, text=delta.text
            )

        await append_fenced(
            engine=self.engine,
            bus=self.bus,
            turn=turn,
            owner=self.owner,
            lease_ttl_s=self.lease_ttl_s,
            attempted=EventType.TURN_DELTA,
            write=write,
        )
