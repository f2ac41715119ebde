"""The async engine (SQLAlchemy over asyncpg) and the URL forms it accepts."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncpg
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from keyturn.errors import DatabaseUnavailable, OutcomeUnknown

T = TypeVar("T")


def sqlalchemy_url(url: str) -> str:
    """``postgresql://…`` (what people paste) → the asyncpg driver form."""
    u = make_url(url)
    return u.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def asyncpg_dsn(url: str) -> str:
    """Any accepted form → a plain libpq-style DSN for asyncpg.connect()."""
    u = make_url(url)
    return u.set(drivername="postgresql").render_as_string(hide_password=False)


def _is_local(url: str) -> bool:
    u = make_url(url)
    host = u.host or str(u.query.get("host", "")) or ""
    return host in ("", "localhost", "::1") or host.startswith(("127.", "/"))


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    connect_args: dict[str, Any] = {"server_settings": {"application_name": "keyturn"}}
    if _is_local(url) and "ssl" not in make_url(url).query and "sslmode" not in make_url(url).query:
        # A Unix socket or loopback needs no TLS; asking first costs a round
        # trip on every new connection.
        connect_args["ssl"] = False
    engine = create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        # Every statement of the runtime is its own transaction (one round
        # trip); set once here rather than on every checkout (~25 µs each).
        # Migrations ask for a real transaction (keyturn.db.migrate).
        isolation_level="AUTOCOMMIT",
        # No overflow: connections opened for a burst and closed after it cost
        # a connect each time and lose their prepared statements. Size the pool.
        max_overflow=0,
        # No ping (a round trip on every checkout): the check below is free.
        pool_pre_ping=False,
        pool_recycle=3600,
        connect_args=connect_args,
    )
    event.listen(engine.sync_engine.pool, "checkout", _refuse_closed)
    return engine


def _refuse_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A pooled connection the server closed while it sat idle (a restart,
    ``pg_terminate_backend``) is replaced at checkout, so the request that
    draws it does not fail. asyncpg has already seen the socket close."""
    driver = getattr(dbapi_connection, "driver_connection", None)
    if driver is not None and driver.is_closed():
        raise sa_exc.DisconnectionError("connection closed by the server while idle")


# SQLSTATE classes that mean "the server or the connection went away".
_UNAVAILABLE_CLASSES = ("08", "57P", "53")
# A transaction the server rolled back on its own (deadlock, serialization
# failure) or whose completion is unknown: nothing of it committed, or it must
# be re-read; either way the request may be retried.
_ROLLED_BACK_STATES = ("40001", "40003", "40P01")


def sqlstate_of(error: BaseException) -> str | None:
    orig = getattr(error, "orig", None)
    for candidate in (orig, getattr(orig, "__cause__", None), error):
        state = getattr(candidate, "sqlstate", None)
        if state:
            return str(state)
    return None


def is_unavailable(error: BaseException) -> bool:
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(
        error, OSError | ConnectionError | asyncpg.exceptions.ConnectionDoesNotExistError
    ):
        return True
    if isinstance(error, asyncpg.InterfaceError) and "closed" in str(error):
        return True
    if isinstance(error, asyncpg.exceptions.InternalClientError):
        return True  # a connection left mid-operation by an earlier failure
    orig = getattr(error, "orig", None)
    if isinstance(getattr(orig, "__cause__", None), OSError | ConnectionError):
        return True
    state = sqlstate_of(error)
    if state in _ROLLED_BACK_STATES:
        return True
    return state is not None and state.startswith(_UNAVAILABLE_CLASSES)


@asynccontextmanager
async def connect(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A pooled connection in autocommit mode: each statement is its own
    transaction, which is one round trip for the single-statement writes."""
    try:
        async with engine.connect() as conn:
            try:
                yield conn
            except BaseException as error:
                if is_unavailable(error) or isinstance(error, asyncio.CancelledError):
                    # Statements run on the driver connection directly
                    # (Statement) fail without SQLAlchemy seeing it: never
                    # hand a connection that failed mid-statement back to the
                    # pool, where the next checkout (the re-read that settles
                    # an admission, say) would draw it.
                    with contextlib.suppress(Exception):
                        await conn.invalidate()
                raise
    except (
        sa_exc.DBAPIError,
        OSError,
        ConnectionError,
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        asyncpg.exceptions.InternalClientError,
    ) as error:
        if is_unavailable(error):
            raise DatabaseUnavailable() from error
        raise


_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


class Statement:
    """SQL with ``:name`` parameters, run on the asyncpg connection beneath the
    pool, which prepares it once per connection and caches it.

    For the hottest statements (admission): SQLAlchemy's per-execution work
    cost as much as the database's here (measured: +50% admissions/s without
    it). Same SQL, same pool, same autocommit transactions.
    """

    def __init__(self, sql: str) -> None:
        self.text = sql
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        self.sql = _PARAM.sub(number, sql)
        self.names = tuple(names)

    def __str__(self) -> str:
        return self.text

    async def fetchrow(self, conn: AsyncConnection, **params: Any) -> Mapping[str, Any] | None:
        record: Mapping[str, Any] | None = await (await self._driver(conn)).fetchrow(
            self.sql, *(params[name] for name in self.names)
        )
        return record

    async def fetch(self, conn: AsyncConnection, **params: Any) -> list[Mapping[str, Any]]:
        records: list[Mapping[str, Any]] = await (await self._driver(conn)).fetch(
            self.sql, *(params[name] for name in self.names)
        )
        return records

    @staticmethod
    async def _driver(conn: AsyncConnection) -> Any:
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        return driver


__all__ = [
    "DatabaseUnavailable",
    "OutcomeUnknown",
    "Statement",
    "asyncpg_dsn",
    "connect",
    "create_engine",
    "is_unavailable",
    "sqlalchemy_url",
    "sqlstate_of",
]
