"""Errors a client may see as they are. Everything else is masked."""

from __future__ import annotations

from typing import Any

from keyturn.errors import KeyturnError


class PublicError(KeyturnError):
    """The request could not be served."""

    code = "BAD_REQUEST"
    retryable = False

    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "retryable": self.retryable}


class BadArgument(PublicError):
    """An argument is out of range or malformed."""

    code = "BAD_USER_INPUT"


class NotFoundError(PublicError):
    """Not found."""

    code = "NOT_FOUND"


class Unavailable(PublicError):
    """The database did not answer; retry the request (with the same idempotency key)."""

    code = "UNAVAILABLE"
    retryable = True


class NotAdmitting(PublicError):
    """This server is shutting down and admits no new turns; retry (another server will answer)."""

    code = "SHUTTING_DOWN"
    retryable = True
