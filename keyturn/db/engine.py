"""Connections: the pool (SQLAlchemy's, over asyncpg), the URL forms Keyturn
accepts, and :func:`connect`, the one way the runtime gets a connection.

Statements do not go through SQLAlchemy (see :mod:`keyturn.db.sql`): a
:class:`Conn` carries the asyncpg connection beneath the pooled one. The pool
stays SQLAlchemy's for its replacement of connections the server closed and
its invalidation of connections that failed mid-statement; Alembic runs on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from keyturn.db.failures import DRIVER_ERRORS, is_unavailable
from keyturn.errors import DatabaseUnavailable

# What the layers above pass around: the pool. They only hand it back to
# ``connect`` (and dispose of it), so they need not know whose pool it is.
Engine = AsyncEngine


def sqlalchemy_url(url: str) -> str:
    """``postgresql://…`` (what people paste) → the asyncpg driver form."""
    u = make_url(url)
    return u.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def asyncpg_dsn(url: str) -> str:
    """Any accepted form → a plain libpq-style DSN for asyncpg.connect()."""
    u = make_url(url)
    return u.set(drivername="postgresql").render_as_string(hide_password=False)


def with_database(url: str, name: str) -> str:
    """The same server and credentials, another database."""
    return make_url(url).set(database=name).render_as_string(hide_password=False)


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
        # The dialect installs this as the driver's jsonb decoder, so event
        # data arrives as dicts on the asyncpg connection too.
        json_deserializer=orjson.loads,
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


class Conn:
    """A pooled connection, as the statements of :mod:`keyturn.db` take it."""

    __slots__ = ("driver", "pooled")

    def __init__(self, driver: Any, pooled: AsyncConnection) -> None:
        self.driver = driver  # the asyncpg connection
        self.pooled = pooled


@asynccontextmanager
async def connect(engine: AsyncEngine) -> AsyncIterator[Conn]:
    """A pooled connection in autocommit mode: each statement is its own
    transaction, which is one round trip for the single-statement writes.

    A failure that means the database or the connection went away is raised
    as :class:`~keyturn.errors.DatabaseUnavailable`; nothing above ``db``
    sees a driver exception of that kind."""
    try:
        async with engine.connect() as pooled:
            raw = await pooled.get_raw_connection()
            try:
                yield Conn(raw.driver_connection, pooled)
            except BaseException as error:
                if is_unavailable(error) or isinstance(error, asyncio.CancelledError):
                    # The statement failed on the driver connection, where
                    # SQLAlchemy did not see it: never hand a connection that
                    # failed mid-statement back to the pool, where the next
                    # checkout (the re-read that settles an admission, say)
                    # would draw it.
                    with contextlib.suppress(Exception):
                        await pooled.invalidate()
                raise
    except DRIVER_ERRORS as error:
        if is_unavailable(error):
            raise DatabaseUnavailable() from error
        raise
