"""Database URLs as managed PostgreSQL hands them out: ``sslmode`` and the other
libpq parameters, read the same way by every command and connection, against a
server with TLS on and the same server with TLS off."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from keyturn.db.engine import connect, connect_params, create_engine, raw_connect
from keyturn.ops import databases
from tests.acceptance.clirun import keyturn, one_clean_line
from tests.acceptance.tcp_postgres import TcpPostgres, tcp_postgres
from tests.support import start_server_process, stop_process

pytestmark = pytest.mark.slow

ENCRYPTED = """
    SELECT a.application_name, s.ssl
    FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
    WHERE a.datname = $1 AND a.application_name LIKE 'keyturn%'
"""


@pytest.fixture(scope="module")
def tls_pg() -> Iterator[TcpPostgres]:
    with tcp_postgres() as server:
        yield server


async def _encrypted_by_engine(url: str) -> bool:
    engine = create_engine(url, pool_size=1)
    try:
        async with connect(engine) as conn:
            return bool(
                await conn.driver.fetchval(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                )
            )
    finally:
        await engine.dispose()


async def _encrypted_by_raw(url: str) -> bool:
    conn = await raw_connect(url)
    try:
        return bool(await conn.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"))
    finally:
        await conn.close()


async def _keyturn_backends(tls_pg: TcpPostgres, database: str) -> dict[str, bool]:
    conn = await raw_connect(tls_pg.superuser_url)
    try:
        rows = await conn.fetch(ENCRYPTED, database)
        return {r["application_name"].split(":")[0]: r["ssl"] for r in rows}
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("mode", "encrypted"), [("disable", False), ("prefer", True), ("require", True)]
)
def test_sslmode_against_a_server_with_tls_on(
    tls_pg: TcpPostgres, tmp_path: Path, mode: str, encrypted: bool
) -> None:
    tls_pg.set_ssl(True)
    url = tls_pg.url(query=f"sslmode={mode}")
    # The pool and the plain connections (listener, administration) alike.
    assert asyncio.run(_encrypted_by_engine(url)) is encrypted
    assert asyncio.run(_encrypted_by_raw(url)) is encrypted
    up = keyturn("db", "upgrade", cwd=tmp_path, KEYTURN_DATABASE_URL=url)
    assert up.returncode == 0, up.stderr
    cur = keyturn("db", "current", cwd=tmp_path, KEYTURN_DATABASE_URL=url)
    assert cur.returncode == 0 and "up to date" in cur.stdout, cur.stderr
    doctor = keyturn("doctor", cwd=tmp_path, KEYTURN_DATABASE_URL=url)
    assert "ok    database: reachable" in doctor.stdout, doctor.stdout + doctor.stderr
    assert tls_pg.password not in doctor.stdout + doctor.stderr


def test_serve_pool_and_listener_follow_the_url(tls_pg: TcpPostgres, tmp_path: Path) -> None:
    tls_pg.set_ssl(True)
    for mode, encrypted in (("require", True), ("disable", False)):
        database = f"kt_serve_{mode}"
        url = tls_pg.create_database(database) + f"?sslmode={mode}"
        assert keyturn("db", "upgrade", cwd=tmp_path, KEYTURN_DATABASE_URL=url).returncode == 0
        server = start_server_process(url, tmp_path, name=f"serve-{mode}")
        try:
            assert httpx.get(server.url + "/readyz", timeout=10).status_code == 200
            backends = asyncio.run(_keyturn_backends(tls_pg, database))
        finally:
            stop_process(server)
        # The pool's connections and the listener's own one.
        assert {"keyturn", "keyturn-listener"} <= backends.keys(), backends
        assert set(backends.values()) == {encrypted}, (mode, backends)
        assert tls_pg.password not in server.log()


def test_token_commands_and_throwaway_databases_take_sslmode(
    tls_pg: TcpPostgres, tmp_path: Path
) -> None:
    tls_pg.set_ssl(True)
    url = tls_pg.create_database("kt_tokens") + "?sslmode=require"
    created = keyturn("token", "create", "--name", "tls", cwd=tmp_path, KEYTURN_DATABASE_URL=url)
    assert created.returncode == 0, created.stderr
    listed = keyturn("token", "list", cwd=tmp_path, KEYTURN_DATABASE_URL=url)
    assert listed.returncode == 0 and "tls" in listed.stdout, listed.stderr
    # What the interruption experiment, the benchmark and the tests make
    # their databases with.
    server_url = tls_pg.url(database="postgres", query="sslmode=require")
    with databases.throwaway_database(server_url, prefix="kt_tls") as throwaway:
        assert "sslmode=require" in throwaway
        assert asyncio.run(_encrypted_by_raw(throwaway)) is True


def test_verify_full_takes_the_root_certificate_from_the_url(
    tls_pg: TcpPostgres, tmp_path: Path
) -> None:
    tls_pg.set_ssl(True)
    url = tls_pg.url(query=f"sslmode=verify-full&sslrootcert={tls_pg.cert}")
    assert asyncio.run(_encrypted_by_raw(url)) is True
    stranger = tmp_path / "other-root.crt"
    stranger.write_text(tls_pg.cert.read_text())  # a copy verifies too
    assert asyncio.run(_encrypted_by_raw(url.replace(str(tls_pg.cert), str(stranger))))
    missing = keyturn(
        "db",
        "current",
        cwd=tmp_path,
        KEYTURN_DATABASE_URL=url.replace(str(tls_pg.cert), str(tmp_path / "none.crt")),
    )
    line = one_clean_line(missing)
    assert "none.crt" in line and tls_pg.password not in line


@pytest.mark.parametrize("mode", ["disable", "prefer"])
def test_server_with_tls_off_serves_disable_and_prefer_unencrypted(
    tls_pg: TcpPostgres, tmp_path: Path, mode: str
) -> None:
    tls_pg.set_ssl(False)
    url = tls_pg.url(query=f"sslmode={mode}")
    assert asyncio.run(_encrypted_by_engine(url)) is False
    assert asyncio.run(_encrypted_by_raw(url)) is False
    cur = keyturn("db", "current", cwd=tmp_path, KEYTURN_DATABASE_URL=url)
    assert cur.returncode in (0, 1) and cur.stdout.startswith("revision"), cur.stderr


def test_require_against_a_server_with_tls_off_is_one_line(
    tls_pg: TcpPostgres, tmp_path: Path
) -> None:
    tls_pg.set_ssl(False)
    url = tls_pg.url(query="sslmode=require")
    for command in (("db", "upgrade"), ("db", "current"), ("serve",), ("token", "list")):
        result = keyturn(*command, cwd=tmp_path, KEYTURN_DATABASE_URL=url)
        line = one_clean_line(result)
        assert "does not offer TLS" in line and "KEYTURN_DATABASE_URL" in line, line
        assert tls_pg.password not in result.stdout + result.stderr
        assert "Keyturn on" not in result.stdout
    doctor = keyturn("doctor", cwd=tmp_path, KEYTURN_DATABASE_URL=url)
    assert doctor.returncode == 1
    assert "fail  database: cannot connect" in doctor.stdout and "TLS" in doctor.stdout
    assert tls_pg.password not in doctor.stdout + doctor.stderr


def test_libpq_parameters_reach_the_server(database_url: str) -> None:
    sep = "&" if "?" in database_url else "?"
    url = (
        f"{database_url}{sep}application_name=keyturn-eu&connect_timeout=7"
        "&options=-c%20statement_timeout%3D4321"
    )
    assert connect_params(url)["timeout"] == 7.0

    async def look() -> tuple[str, str, str]:
        engine = create_engine(url, pool_size=1)
        try:
            async with connect(engine) as conn:
                row = await conn.driver.fetchrow(
                    "SELECT current_setting('application_name') a, "
                    "current_setting('statement_timeout') t"
                )
        finally:
            await engine.dispose()
        listener = await raw_connect(url, server_settings={"application_name": "mine"})
        try:
            mine = await listener.fetchval("SELECT current_setting('application_name')")
        finally:
            await listener.close()
        return row["a"], row["t"], mine

    assert asyncio.run(look()) == ("keyturn-eu", "4321ms", "mine")


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("sslmode=sometimes", "sslmode='sometimes'"),
        ("pool=5", "'pool'"),
        ("connect_timeout=soon", "connect_timeout='soon'"),
    ],
)
def test_a_parameter_keyturn_cannot_honour_is_one_line(
    tmp_path: Path, query: str, named: str
) -> None:
    url = f"postgresql://someone:pw-never-shown@127.0.0.1:1/db?{query}"
    for command in (("db", "current"), ("serve",)):
        line = one_clean_line(keyturn(*command, cwd=tmp_path, KEYTURN_DATABASE_URL=url))
        assert named in line and "KEYTURN_DATABASE_URL" in line, line
        assert "pw-never-shown" not in line
    doctor = keyturn("doctor", cwd=tmp_path, KEYTURN_DATABASE_URL=url)
    assert doctor.returncode == 1 and "fail  database: KEYTURN_DATABASE_URL" in doctor.stdout
    assert named in doctor.stdout and "pw-never-shown" not in doctor.stdout
