"""Keyturn's exceptions. Each class's docstring is its default message."""

from __future__ import annotations


class KeyturnError(Exception):
    """Keyturn could not do that."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class DatabaseUnavailable(KeyturnError):
    """The database did not answer; the request may be retried."""


class OutcomeUnknown(DatabaseUnavailable):
    """The connection was lost while the database was committing; retry with the same key."""


class ShuttingDown(KeyturnError):
    """This server is shutting down and admits no new turns; retry on another."""


class StaleLease(KeyturnError):
    """The turn's lease passed to another owner; this write was refused."""
