"""Which driver failures are retryable (``DatabaseUnavailable``)."""

from __future__ import annotations

import asyncpg
import pytest

from keyturn.db.failures import is_unavailable


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
