"""Wake-ups between processes: PostgreSQL LISTEN/NOTIFY on one dedicated connection.

A notification carries only session ids; the events table stays the truth, and
whoever is woken re-reads it. Notifications are sent after the writing
transaction has committed, from this same connection, and coalesced: while one
NOTIFY is in flight, and for a few milliseconds after it starts, the ids that
arrive meanwhile wait and go out together. That keeps the global notify lock
out of admission's commits and sends one NOTIFY per burst rather than one per
event.

The connection is not pooled (a pool resets listeners on release). When it
drops, it is opened again, LISTEN is issued again, and ``on_reconnect`` runs so
that the caller can re-read from every cursor it holds: anything committed
while nobody listened is found that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from keyturn.db.engine import raw_connect
from keyturn.db.failures import DRIVER_ERRORS
from keyturn.waits import set_within, within

log = logging.getLogger(__name__)

# What losing the dedicated connection can raise; anything else is a bug, for
# the supervisor to log and restart.
# (An InternalClientError is a connection the driver left mid-operation when
# the server went away: as lost as a closed one.)
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (*DRIVER_ERRORS, TimeoutError)

CHANNEL = "keyturn_events"
# NOTIFY payloads must stay under 8000 bytes; a UUID and a comma are 37.
_MAX_PAYLOAD = 7900
# A NOTIFY starts at most this often: the first wake-up after a quiet moment
# goes out at once, and those that follow within the gap wait for its end
# and go out together. Under load a NOTIFY per burst was one every request
# or two (a statement, a commit and a socket write each: about a tenth of a
# process's CPU while it admits new keys, py-spy); now it is at most 200 a
# second, for at most 5 ms more on a wake-up between processes.
NOTIFY_GAP_S = 0.005


def _chunks(ids: Iterable[str]) -> list[str]:
    out: list[str] = []
    current: list[str] = []
    size = 0
    for sid in ids:
        if size + len(sid) + 1 > _MAX_PAYLOAD and current:
            out.append(",".join(current))
            current, size = [], 0
        current.append(sid)
        size += len(sid) + 1
    if current:
        out.append(",".join(current))
    return out


class Listener:
    def __init__(
        self,
        dsn: str,
        *,
        on_wake: Callable[[uuid.UUID], None],
        on_reconnect: Callable[[], None],
        health_check_s: float = 5.0,
    ) -> None:
        self._dsn = dsn
        self._on_wake = on_wake
        self._on_reconnect = on_reconnect
        self._health_check_s = health_check_s
        self._conn: Any = None
        self._lost = asyncio.Event()
        self._pending: set[str] = set()
        self._has_pending = asyncio.Event()
        # One query at a time on the connection: the health check and the
        # sender would otherwise collide ("another operation is in progress").
        self._io = asyncio.Lock()
        self.connected = asyncio.Event()
        self.reconnects = 0

    async def start(self) -> None:
        """Open the connection and LISTEN. The two loops, :meth:`supervise` and
        :meth:`send_forever`, are run by the process's supervisor."""
        await self._connect()

    async def stop(self) -> None:
        """Close the connection (the loops were cancelled first)."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await within(self._conn.close(), 2)

    def wake(self, session_id: uuid.UUID) -> None:
        """Tell every process (this one included) that ``session_id`` has news."""
        self._pending.add(str(session_id))
        self._has_pending.set()

    async def backend_pid(self) -> int | None:
        return None if self._conn is None else int(self._conn.get_server_pid())

    async def _connect(self) -> None:
        # The process id in the name lets an operator (or a test) find this
        # process's listener in pg_stat_activity. A NOTIFY needs a transaction
        # id, so each one is a commit; it protects no data (a lost wake-up is
        # found by the subscribers' poll), so it need not wait for the WAL flush.
        conn = await raw_connect(
            self._dsn,
            server_settings={
                "application_name": f"keyturn-listener:{os.getpid()}",
                "synchronous_commit": "off",
            },
        )
        self._lost.clear()
        conn.add_termination_listener(lambda _c: self._lost.set())
        await conn.add_listener(CHANNEL, self._received)
        self._conn = conn
        self.connected.set()

    def _received(self, conn: Any, pid: int, _channel: str, payload: str) -> None:
        if pid == conn.get_server_pid():
            return  # our own wake-up: this process was told directly
        for part in payload.split(","):
            try:
                self._on_wake(uuid.UUID(part))
            except ValueError:
                log.warning("ignoring malformed wake-up payload")

    async def supervise(self) -> None:
        """Keep the connection: check it, and open it again when it is lost."""
        backoff = 0.1
        while True:
            if not await set_within(self._lost, self._health_check_s):
                # A half-open TCP connection never reports itself: ask.
                try:
                    async with self._io:
                        # within, not wait_for: a stop that lands with the
                        # answer must end this loop (keyturn.waits).
                        await within(self._conn.fetchval("SELECT 1"), 5)
                    continue
                except Exception:
                    self._lost.set()
            self.connected.clear()
            log.warning("listener connection lost; reconnecting")
            with contextlib.suppress(Exception):
                self._conn.terminate()
            while True:
                try:
                    await self._connect()
                    break
                except _CONNECTION_ERRORS as error:
                    log.warning("listener reconnect failed (%s); retrying", type(error).__name__)
                    await asyncio.sleep(backoff)
                    # At most a second between attempts: while nobody
                    # listens, subscribers hear only the slow safety-net poll.
                    backoff = min(backoff * 2, 1.0)
            backoff = 0.1
            self.reconnects += 1
            log.info("listener reconnected; re-reading from every subscriber's cursor")
            self._on_reconnect()

    async def send_forever(self) -> None:
        """Send the coalesced wake-ups, one NOTIFY per burst, at most one per
        NOTIFY_GAP_S."""
        while True:
            await self._has_pending.wait()
            await self.connected.wait()
            self._has_pending.clear()
            ids, self._pending = self._pending, set()
            started = asyncio.get_running_loop().time()
            try:
                await self._send(ids)
            except _CONNECTION_ERRORS as error:  # supervise() reconnects; keep the ids
                log.warning("sending wake-up failed (%s); will resend", type(error).__name__)
                self._pending |= ids
                self._has_pending.set()
                self._lost.set()
                await asyncio.sleep(0.05)
            except BaseException:
                self._pending |= ids  # kept for whoever runs this loop next
                self._has_pending.set()
                raise
            else:
                rest = NOTIFY_GAP_S - (asyncio.get_running_loop().time() - started)
                if rest > 0:
                    await asyncio.sleep(rest)

    async def _send(self, ids: set[str]) -> None:
        async with self._io:
            for payload in _chunks(sorted(ids)):
                await self._conn.execute("SELECT pg_notify($1, $2)", CHANNEL, payload)
