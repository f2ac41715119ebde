"""What a database error means, decided once, here.

Callers above ``db`` never look at a driver exception: a lost connection
becomes :class:`~keyturn.errors.DatabaseUnavailable` and a timeout
:class:`~keyturn.errors.DatabaseBusy` (in :func:`keyturn.db.engine.connect`),
and a unique violation a statement expects (a duplicate ledger entry, a lost
race for a key) becomes a typed result of the function that ran it, found by
:func:`violated`.
"""

from __future__ import annotations

import asyncpg

# Everything the driver and the pool raise for a failed statement or connection
# (a checkout that waits too long is DatabaseBusy already, in ``connect``).
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ConnectionError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)

# SQLSTATE classes that mean "the server or the connection went away".
_UNAVAILABLE_CLASSES = ("08", "57P", "53")
# A transaction the server rolled back on its own (deadlock, serialization
# failure) or whose completion is unknown: nothing of it committed, or it must
# be re-read; either way the request may be retried.
_ROLLED_BACK_STATES = ("40001", "40003", "40P01")
# query_canceled and lock_not_available: see is_busy.
_BUSY_STATES = ("57014", "55P03")


def sqlstate_of(error: BaseException) -> str | None:
    orig = getattr(error, "orig", None)
    for candidate in (orig, getattr(orig, "__cause__", None), error):
        state = getattr(candidate, "sqlstate", None)
        if state:
            return str(state)
    return None


def is_busy(error: BaseException) -> bool:
    """The database refused to wait any longer, and nothing of the statement
    committed: the server cancelled the statement
    (statement_timeout, or an operator's pg_cancel_backend: 57014) or its lock
    wait (lock_timeout: 55P03). PostgreSQL never raises either once a commit
    has begun, so a retry may succeed and need not re-read anything. (A
    checkout that found no free connection in time is busy too: ``connect``
    raises that DatabaseBusy itself.)

    A cancel Keyturn issues itself (a task cancelled mid-statement) never gets
    here: the task sees ``CancelledError``, not the server's 57014, and
    :func:`keyturn.db.engine.connect` drops that connection rather than let a
    late cancel reach the next statement on it."""
    return sqlstate_of(error) in _BUSY_STATES


def is_unavailable(error: BaseException) -> bool:
    if is_busy(error):
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


def violated(error: BaseException) -> str | None:
    """The unique index or constraint a statement violated, or None when the
    error is something else."""
    if isinstance(error, asyncpg.UniqueViolationError):
        name = getattr(error, "constraint_name", None)
        return str(name) if name else ""
    return None
