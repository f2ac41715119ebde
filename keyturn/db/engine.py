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
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import orjson
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from keyturn.db.failures import DRIVER_ERRORS, is_busy, is_unavailable
from keyturn.errors import DatabaseBusy, DatabaseUnavailable

# What the layers above pass around: the pool. They only hand it back to
# ``connect`` (and dispose of it), so they need not know whose pool it is.
Engine = AsyncEngine


class DatabaseUrlError(ValueError):
    """The database URL asks for something Keyturn cannot honour. The message
    names the parameter, never the password."""


# libpq's URL parameters that asyncpg's own DSN parser implements with libpq's
# meaning (``sslmode=prefer`` falling back to plain, ``require`` verifying the
# server once a root certificate is given, …): they stay in the DSN it gets.
_DSN_PARAMS = frozenset(
    {
        "host",
        "port",
        "user",
        "password",
        "dbname",
        "database",
        "passfile",
        "service",
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslcrl",
        "sslpassword",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
    }
)
# The ones asyncpg would send to the server as settings of those names, which
# the server refuses or misreads: translated here.
_TRANSLATED = ("application_name", "options", "connect_timeout", "ssl")
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _parse(url: str) -> Any:
    try:
        u = make_url(url)
    except Exception:
        raise DatabaseUrlError(
            "KEYTURN_DATABASE_URL is not a database URL "
            "(expected postgresql://user:password@host:5432/database)"
        ) from None
    if u.get_backend_name() not in ("postgresql", "postgres"):
        raise DatabaseUrlError(
            f"KEYTURN_DATABASE_URL names a {u.get_backend_name()!r} database; "
            "Keyturn needs postgresql://…"
        )
    return u


def _query(u: Any) -> dict[str, str]:
    # A parameter given twice: the last one counts, as in libpq.
    return {k: v[-1] if isinstance(v, tuple) else v for k, v in u.query.items()}


def safe_url(url: str) -> str:
    """The URL with its password masked, for messages."""
    try:
        return str(make_url(url).render_as_string(hide_password=True))
    except Exception:
        return "(not a URL)"


def sqlalchemy_url(url: str) -> str:
    """``postgresql://…`` (what people paste) → the asyncpg driver form, without
    the query: how to connect is :func:`connect_params`'s business."""
    u = _parse(url)
    return str(
        u.set(drivername="postgresql+asyncpg", query={}).render_as_string(hide_password=False)
    )


def asyncpg_dsn(url: str) -> str:
    """Any accepted form → a libpq-style URL (parameters kept, for
    :func:`connect_params` or :func:`raw_connect`)."""
    u = _parse(url)
    return str(u.set(drivername="postgresql").render_as_string(hide_password=False))


def with_database(url: str, name: str) -> str:
    """The same server and credentials, another database."""
    return str(make_url(url).set(database=name).render_as_string(hide_password=False))


def _is_local(u: Any, query: dict[str, str]) -> bool:
    host = u.host or query.get("host", "") or ""
    return host in ("", "localhost", "::1") or host.startswith(("127.", "/"))


def connect_params(
    url: str, *, server_settings: dict[str, str] | None = None, application_name: str = "keyturn"
) -> dict[str, Any]:
    """What ``asyncpg.connect(**params)`` takes for ``url``: the one
    translation every Keyturn connection goes through (the pool, the
    listener, administrative connections, the tests).

    ``application_name`` is a default the URL may override; ``server_settings``
    are the caller's and win over the URL's."""
    u = _parse(url)
    query = _query(u)
    settings = {"application_name": query.pop("application_name", application_name)}
    if "options" in query:
        # libpq's startup ``options`` (``-c name=value …``); the server reads
        # it from the startup packet exactly as libpq sends it.
        settings["options"] = query.pop("options")
    settings.update(server_settings or {})
    params: dict[str, Any] = {"server_settings": settings}
    if "connect_timeout" in query:
        raw = query.pop("connect_timeout")
        try:
            timeout = float(raw)
        except ValueError:
            raise DatabaseUrlError(
                f"KEYTURN_DATABASE_URL: connect_timeout={raw!r} is not a number of seconds"
            ) from None
        # libpq: zero or less means wait indefinitely.
        params["timeout"] = timeout if timeout > 0 else None
    if "ssl" in query:
        # The spelling asyncpg and SQLAlchemy users know: the same values.
        if "sslmode" in query:
            raise DatabaseUrlError("KEYTURN_DATABASE_URL: give sslmode or ssl, not both")
        query["sslmode"] = query.pop("ssl")
    mode = query.get("sslmode")
    if mode is not None and mode not in SSLMODES:
        raise DatabaseUrlError(
            f"KEYTURN_DATABASE_URL: sslmode={mode!r} is not one of {', '.join(SSLMODES)}"
        )
    unknown = sorted(set(query) - _DSN_PARAMS)
    if unknown:
        raise DatabaseUrlError(
            f"KEYTURN_DATABASE_URL: parameter {unknown[0]!r} is not one Keyturn can honour "
            f"(it takes {', '.join(sorted(_DSN_PARAMS | set(_TRANSLATED)))})"
        )
    if mode is None and _is_local(u, query):
        # A Unix socket or loopback needs no TLS; asking first costs a round
        # trip on every new connection. The URL may still ask for it.
        params["ssl"] = False
    params["dsn"] = u.set(drivername="postgresql", query=query).render_as_string(
        hide_password=False
    )
    return params


async def raw_connect(url: str, *, server_settings: dict[str, str] | None = None) -> Any:
    """A plain asyncpg connection (no pool), translated as the pool's are."""
    return await asyncpg.connect(**connect_params(url, server_settings=server_settings))


def create_engine(url: str, *, pool_size: int = 10, pool_timeout: float = 30.0) -> AsyncEngine:
    params = connect_params(url)

    async def _connect() -> Any:
        # The pool's connections are made here rather than by the dialect,
        # which would hand every URL parameter to asyncpg as a keyword.
        return await asyncpg.connect(**params)

    engine = create_async_engine(
        sqlalchemy_url(url),
        async_creator=_connect,
        pool_size=pool_size,
        # Seconds a checkout waits for a free connection before
        # ``connect`` raises DatabaseUnavailable (the pool's TimeoutError).
        pool_timeout=pool_timeout,
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
    as :class:`~keyturn.errors.DatabaseUnavailable`, a timeout (the pool's,
    the server's statement or lock timeout) as its subclass
    :class:`~keyturn.errors.DatabaseBusy`; nothing above ``db`` sees a driver
    exception of that kind."""
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
        if is_busy(error):
            raise DatabaseBusy() from error
        if is_unavailable(error):
            raise DatabaseUnavailable() from error
        raise


def _chain(error: BaseException) -> list[BaseException]:
    """The error and what caused it, outermost first (SQLAlchemy wraps the
    driver's exception once or twice)."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        orig = getattr(current, "orig", None)
        nxt = current.__cause__ or current.__context__
        current = orig if isinstance(orig, BaseException) and orig not in seen else nxt
    return seen


def connect_failure(error: BaseException) -> str | None:
    """Why no connection could be made, in one line for a person; None when
    ``error`` is not about reaching the database (a bug keeps its traceback).

    The driver's messages name the host, the user and the database, never the
    password."""
    for e in _chain(error):
        if isinstance(e, DatabaseUrlError):
            return str(e)
    for e in reversed(_chain(error)):
        if isinstance(e, socket.gaierror):
            return f"unknown host ({e.strerror or e})"
        if isinstance(e, ConnectionRefusedError):
            return f"connection refused: nothing accepts connections there ({e})"
        if isinstance(e, TimeoutError):
            return "no answer from the server in time"
        if isinstance(e, ConnectionError) and "rejected SSL upgrade" in str(e):
            return f"the server does not offer TLS, which the URL's sslmode requires ({e})"
        if isinstance(e, ssl.SSLError):
            return f"TLS failed: {e.reason or e}"
        if isinstance(e, OSError):
            return str(e) or type(e).__name__
        if isinstance(e, asyncpg.InvalidCatalogNameError):
            return f"{e} (create it, or name another database in the URL)"
        if isinstance(
            e,
            (
                asyncpg.InvalidAuthorizationSpecificationError,
                asyncpg.InvalidPasswordError,
                asyncpg.CannotConnectNowError,
                asyncpg.TooManyConnectionsError,
                asyncpg.ClientConfigurationError,
                asyncpg.InterfaceError,
            ),
        ):
            return str(e) or type(e).__name__
        if isinstance(e, asyncpg.PostgresError) and is_unavailable(e):
            return str(e) or type(e).__name__
    return None
