"""Which driver failures are retryable (``DatabaseUnavailable``)."""

from __future__ import annotations

import asyncpg
import pytest

from keyturn.db.failures import is_busy, is_unavailable


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.exceptions.DeadlockDetectedError("deadlock detected"),
        asyncpg.exceptions.SerializationError("could not serialize access"),
        asyncpg.exceptions.AdminShutdownError("terminating connection"),
        asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"),
        asyncpg.exceptions.InternalClientError("cannot switch to state 12"),
        ConnectionResetError(),
        # The database busy: statement_timeout (or an operator's cancel), lock_timeout.
        asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
        asyncpg.exceptions.LockNotAvailableError("canceling statement due to lock timeout"),
    ],
)
def test_transient_failures_are_retryable(error: BaseException) -> None:
    assert is_unavailable(error)


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.exceptions.UniqueViolationError("duplicate key"),
        asyncpg.exceptions.UndefinedTableError("relation does not exist"),
        asyncpg.exceptions.TransactionIntegrityConstraintViolationError("deferred"),
    ],
)
def test_errors_of_the_request_or_the_code_are_not(error: BaseException) -> None:
    assert not is_unavailable(error)


@pytest.mark.parametrize(
    ("error", "busy"),
    [
        (asyncpg.exceptions.QueryCanceledError("statement timeout"), True),
        (asyncpg.exceptions.LockNotAvailableError("lock timeout"), True),
        (asyncpg.exceptions.AdminShutdownError("terminating connection"), False),
        (ConnectionResetError(), False),
    ],
)
def test_timeouts_are_busy_and_lost_connections_are_not(error: BaseException, busy: bool) -> None:
    # Busy means "nothing committed": admission answers it without a re-read.
    assert is_busy(error) is busy
