"""Connections: the pool (asyncpg's), the URL forms Keyturn accepts, and
:func:`connect`, the one way the runtime gets a connection.

Statements run on the asyncpg connection a :class:`Conn` carries (see
:mod:`keyturn.db.sql`). SQLAlchemy keeps the URL parsing here and the
migrations (:mod:`keyturn.db.migrate`, on an engine of their own).
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
from sqlalchemy.engine import make_url

from keyturn.db.failures import DRIVER_ERRORS, is_busy, is_unavailable
from keyturn.db.tenancy import CLAIM, ConnectionShares
from keyturn.errors import DatabaseBusy, DatabaseUnavailable


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


# The requests' pool keeps each statement's generic plan: PostgreSQL's
# default ("auto") planned a statement anew for each call's values whenever
# that plan's estimate came out cheaper than the generic one, and with arrays
# or a LIMIT as parameters it always did (admission's statement and a page of
# events spent as long being planned as being run, per pg_stat_statements'
# plans and total_plan_time). A request's statements (and the retention
# sweeper's, which shares the pool) read keys and ordered ranges of an
# index, with statuses as literals so the partial indexes match: one plan
# fits every value. The worker's pool keeps PostgreSQL's choice: its
# claim walks a queue whose shape its values decide, and a plan made for them
# took a fifth less time under a backlog than the generic one.
# tests/integration/test_plan_shapes.py checks each statement's plan as its
# pool makes it.
REQUEST_SETTINGS = {"plan_cache_mode": "force_generic_plan"}
WORKER_SETTINGS: dict[str, str] = {}


class Engine:
    """The pool of one kind of work: asyncpg's own, opened on first use.

    What it promises: a connection the server closed while it sat idle (a
    restart, ``pg_terminate_backend``) is replaced at checkout, never handed
    out dead (asyncpg's pool reconnects a holder whose connection is closed);
    a connection that failed mid-statement or whose task was cancelled
    mid-query is terminated, never reused (:func:`connect`); at most
    ``pool_size`` connections, and a checkout that waits ``pool_timeout``
    seconds for one is :class:`~keyturn.errors.DatabaseBusy`.

    ``per_tenant``: a checkout made for a tenant's operation
    (:mod:`keyturn.db.tenancy`) first takes one of that tenant's connections,
    and waiting for it counts in the same ``pool_timeout``. The requests'
    engine; the runtime's own pools (the worker's) never wait on a tenant.

    No SQLAlchemy on this path: its pool cost a few greenlet switches per
    checkout, on every request and every worker write. Alembic gets an engine
    of its own when it migrates (:mod:`keyturn.db.migrate`).
    """

    __slots__ = (
        "_checkouts",
        "_in_use",
        "_params",
        "_per_tenant",
        "_pool",
        "_size",
        "_timeout",
        "_waiting",
        "url",
    )

    def __init__(
        self,
        url: str,
        *,
        pool_size: int,
        pool_timeout: float,
        per_tenant: bool = True,
        server_settings: dict[str, str] | None = None,
    ) -> None:
        self.url = url
        # Translated now, so that a URL Keyturn cannot honour stops the
        # start with DatabaseUrlError rather than the first request.
        self._params = connect_params(url, server_settings=server_settings)
        self._size = pool_size
        self._timeout = pool_timeout
        self._pool: Any = None
        # The pool's connections, handed to checkouts in the order they
        # came: made with the pool, in the event loop it belongs to.
        self._checkouts: asyncio.Semaphore | None = None
        self._in_use = 0
        self._waiting = 0
        self._per_tenant = per_tenant

    def size(self) -> int:
        """How many connections the pool may hold."""
        return self._size

    def checkedout(self) -> int:
        """How many of them are in use now."""
        return self._in_use

    def waiting(self) -> int:
        """How many checkouts wait for one of them now."""
        return self._waiting

    async def _open(self) -> Any:
        # Made here, in the event loop, not in __init__: engines are built
        # before a loop runs, and asyncpg's pool belongs to one. With no
        # connection to open at start (min_size 0: connections are made on
        # demand, as before), the await below does not suspend, so two first
        # checkouts cannot both get here; the check is for safety.
        params = self._params
        pool = asyncpg.create_pool(
            min_size=0,
            max_size=self._size,
            # Idle connections stay: a connection opened for a burst keeps
            # its prepared statements for the next one. asyncpg replaces a
            # connection after 50,000 queries (its max_queries), so none
            # lives for ever.
            max_inactive_connection_lifetime=0,
            connect=lambda *_, **__: _connection(params),
            reset=_no_reset,
        )
        await pool
        if self._pool is None:
            self._pool = pool
            self._checkouts = asyncio.Semaphore(self._size)
        else:
            await pool.close()
        return self._pool

    async def dispose(self) -> None:
        """Close the pool's connections; the next checkout opens a new pool.

        A connection still checked out is waited for (asyncpg's ``close``),
        for at most ten seconds; then every connection is terminated."""
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), _DISPOSE_WAIT_S)


# How long dispose waits for checked-out connections to come back.
_DISPOSE_WAIT_S = 10.0


def create_engine(
    url: str,
    *,
    pool_size: int = 10,
    pool_timeout: float = 30.0,
    per_tenant: bool = True,
    server_settings: dict[str, str] | None = None,
) -> Engine:
    return Engine(
        url,
        pool_size=pool_size,
        pool_timeout=pool_timeout,
        per_tenant=per_tenant,
        server_settings=server_settings,
    )


def _jsonb_encode(text: str) -> bytes:
    # Statements pass JSONB as JSON text; 1 is the binary format's version.
    return b"\x01" + text.encode()


def _jsonb_decode(data: bytes) -> Any:
    return orjson.loads(data[1:])


def _json_decode(data: bytes) -> Any:
    return orjson.loads(data)


async def _connection(params: dict[str, Any]) -> Any:
    """One connection of a pool: from the URL as :func:`connect_params`
    translates it for every connection, with JSON and JSONB read into Python
    values by orjson, as every statement expects (JSONB parameters go in as
    JSON text). Builtin types: setting their codecs costs no round trip."""
    conn = await asyncpg.connect(**params)
    try:
        await conn.set_type_codec(
            "json", encoder=str.encode, decoder=_json_decode, schema="pg_catalog", format="binary"
        )
        await conn.set_type_codec(
            "jsonb",
            encoder=_jsonb_encode,
            decoder=_jsonb_decode,
            schema="pg_catalog",
            format="binary",
        )
    except BaseException:
        conn.terminate()
        raise
    return conn


async def _no_reset(_conn: Any) -> None:
    """Nothing to reset on release: every statement is its own transaction,
    no session setting or advisory lock outlives one, LISTEN has a dedicated
    connection, and asyncpg rolls back a transaction left open. asyncpg's
    default reset (``RESET ALL``, ``UNLISTEN *``, …) is a round trip on every
    release."""


def _open_and_idle(pool: Any) -> bool:
    """Whether asyncpg's pool would hand out a connection without waiting:
    its queue of idle holders gives an open connection first, and only a
    holder with none (or one of an expired generation) connects anew."""
    idle = pool._queue._queue
    if not idle:
        return False
    holder = idle[-1]
    return bool(holder.is_connected() and holder._generation == pool._generation)


async def _release(pool: Any, pooled: Any) -> None:
    """``pool.release(pooled)``, without the task asyncpg's release runs it
    in when it cannot wait. asyncpg shields the release (a task of its own,
    a third of a checkout's CPU) so that a cancelled caller still returns
    the connection; a connection outside a transaction, whose reset is
    nothing (:func:`_no_reset`), is returned without suspending, so nothing
    can cancel it half-way. Anything the release would wait for (a
    rollback, a cancel in flight, a connection retired after its queries or
    of an expired generation, closed on the way back) takes asyncpg's own."""
    driver, holder = pooled._con, pooled._holder
    if (
        driver is None
        or driver.is_in_transaction()
        or driver._protocol._is_cancelling()
        or driver._protocol.queries_count >= holder._max_queries
        or holder._generation != pool._generation
    ):
        await pool.release(pooled)
        return
    driver._on_release()
    await holder.release(None)


class Conn:
    """A pooled connection, as the statements of :mod:`keyturn.db` take it."""

    __slots__ = ("driver",)

    def __init__(self, driver: Any) -> None:
        self.driver = driver  # the asyncpg connection


@asynccontextmanager
async def connect(engine: Engine) -> AsyncIterator[Conn]:
    """A pooled connection in autocommit mode: each statement is its own
    transaction, which is one round trip for the single-statement writes.

    A failure that means the database or the connection went away is raised
    as :class:`~keyturn.errors.DatabaseUnavailable`, a timeout (the pool's,
    the wait for one of the tenant's connections, the server's statement or
    lock timeout) as its subclass :class:`~keyturn.errors.DatabaseBusy`;
    nothing above ``db`` sees a driver exception of that kind."""
    claim = CLAIM.get() if engine._per_tenant else None
    if claim is not None and claim.ended:
        claim = None
    shares: ConnectionShares | None = None  # once the tenant's connection is taken
    checkouts: asyncio.Semaphore | None = None  # once one of the pool's is taken
    # One tenant never holds the whole pool while another may wait: its
    # share (as many as its operations, keyturn.http.fairness) is capped at
    # one less than the pool. A pool of one cannot be shared.
    cap = max(1, engine._size - 1)
    try:
        pool = engine._pool or await engine._open()
        # The pool's own queue lets a checkout that finds a connection idle
        # take it ahead of those already waiting, and sends one it woke but
        # beat to the back of the line: under a closed loop of 64 clients a
        # few waited ten times as long as the rest (bench/README.md, "Waits
        # for a connection in the order they came"). So a checkout first
        # takes its place here, where asyncio's semaphore hands a slot to
        # the oldest waiter; with a slot in hand the pool has a connection
        # for it, or room to open one (a return a cancel cut short may
        # still be on its way back, asyncpg finishing it in a task).
        order = engine._checkouts
        assert order is not None  # made with the pool
        try:
            if (
                not order.locked()
                and _open_and_idle(pool)
                and (claim is None or claim.shares.try_acquire(claim.tenant, cap=cap))
            ):
                # Nothing to wait for: no one waits before this checkout, the
                # tenant's share had room and the pool hands out an idle open
                # connection without suspending, so no timer is armed (a
                # fifth of a checkout's CPU).
                shares = claim.shares if claim is not None else None
                await order.acquire()  # free: it does not suspend
                checkouts = order
                pooled = await pool.acquire()
            else:
                # asyncio.timeout rather than acquire(timeout=): the latter
                # runs the checkout in a task of its own (wait_for) every
                # time. One timeout for the tenant's share and the pool's
                # connection: a checkout waits pool_timeout in all.
                async with asyncio.timeout(engine._timeout):
                    if claim is not None:
                        await claim.shares.acquire(claim.tenant, cap=cap)
                        shares = claim.shares
                    engine._waiting += 1
                    try:
                        await order.acquire()
                    finally:
                        engine._waiting -= 1
                    checkouts = order
                    pooled = await pool.acquire()
        except TimeoutError:
            if claim is not None and shares is None:
                # The tenant's share stayed full: busy, as a full pool is.
                raise DatabaseBusy() from None
            if engine._in_use >= engine._size:
                raise DatabaseBusy() from None
            # A free slot, but no connection made in time: the server is
            # not answering, which is not the pool being busy.
            raise DatabaseUnavailable() from None
        # The connection beneath the pool's proxy: once the server closes
        # it, the proxy is detached and every call on it says "released back
        # to the pool"; the connection itself says "closed", which
        # failures.is_unavailable reads as the lost connection it is.
        driver = pooled._con
        engine._in_use += 1
        try:
            yield Conn(driver)
        except BaseException as error:
            if is_unavailable(error) or isinstance(error, asyncio.CancelledError):
                # Never hand a connection that failed mid-statement back to
                # the pool, where the next checkout (the re-read that
                # settles an admission, say) would draw it in an unknown
                # state, or a late cancel would reach its next statement.
                # Its slot goes back and is connected anew at checkout.
                driver.terminate()
            raise
        finally:
            engine._in_use -= 1
            # A failed release has already terminated the connection
            # (asyncpg does); the statements' outcome stands.
            with contextlib.suppress(Exception):
                await _release(pool, pooled)
    except DRIVER_ERRORS as error:
        if is_busy(error):
            raise DatabaseBusy() from error
        if is_unavailable(error):
            raise DatabaseUnavailable() from error
        raise
    finally:
        # After the connection is back in the pool: the next in line finds
        # it idle, and the tenant never has more connections out than its
        # share.
        if checkouts is not None:
            checkouts.release()
        if shares is not None and claim is not None:
            shares.release(claim.tenant)


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
