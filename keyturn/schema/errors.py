"""What a client sees of an error, decided once for every operation.

Domain errors (keyturn.errors) that are the client's to handle become GraphQL
errors with ``extensions.code`` and ``extensions.retryable``, the same in
queries, mutations and subscriptions (:class:`PublicErrors`, a Strawberry
extension, so no resolver catches them). An invalid request sent to a
mutation is an expected answer instead: the ``InvalidInput`` member of its
result union (:func:`answers_invalid_input`). Everything else is masked as
``Unexpected error.`` and logged as one line (its type, message and where
it was raised; keyturn.logs keeps stack traces and SQL out of log lines).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar, cast

from graphql import GraphQLError
from strawberry.extensions import MaskErrors

from keyturn.errors import (
    DatabaseUnavailable,
    InvalidArgument,
    InvalidRequest,
    NotFound,
    ResponseTooLarge,
    ShuttingDown,
)
from keyturn.schema.enums import ErrorCode
from keyturn.schema.results import InvalidInput

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Public:
    code: str
    retryable: bool  # a retry (with the same idempotency key) may succeed


# The one mapping. A subclass answers as its nearest listed base
# (OutcomeUnknown as DatabaseUnavailable, InvalidRequest as InvalidArgument).
PUBLIC: dict[type[Exception], Public] = {
    InvalidArgument: Public("BAD_USER_INPUT", retryable=False),
    NotFound: Public("NOT_FOUND", retryable=False),
    DatabaseUnavailable: Public("UNAVAILABLE", retryable=True),
    ShuttingDown: Public("SHUTTING_DOWN", retryable=True),
    ResponseTooLarge: Public("RESPONSE_TOO_LARGE", retryable=False),
}


# graphql-core's own report of a client's mistake that surfaced as the cause
# of another error: variables that do not coerce to their declared types
# (a missing field, a wrong type, an unknown enum value, null for a non-null).
CLIENT_MISTAKE = Public("BAD_USER_INPUT", retryable=False)


def public(error: BaseException | None) -> Public | None:
    """How a client sees ``error`` (an error's original cause), or None when
    it is not the client's to see: decided by what the error is."""
    if error is None:
        return None
    if isinstance(error, GraphQLError):
        return CLIENT_MISTAKE
    for cls in type(error).__mro__:
        found = PUBLIC.get(cls)
        if found is not None:
            return found
    return None


def is_unexpected(error: GraphQLError) -> bool:
    # Parse and validation errors carry no original error; listed domain
    # errors are meant for clients.
    original = error.original_error
    return original is not None and public(original) is None


class PublicErrors(MaskErrors):
    """Masks unexpected errors; gives expected ones their code and retryable flag."""

    def __init__(self) -> None:
        super().__init__(should_mask_error=is_unexpected)

    def _process_errors(self, errors: list[GraphQLError]) -> list[GraphQLError]:
        for error in errors:
            found = public(error.original_error)
            if found is not None:
                error.extensions = {
                    **(error.extensions or {}),
                    "code": found.code,
                    "retryable": found.retryable,
                }
        return super()._process_errors(errors)

    def _process_result(self, result: object) -> None:
        # MaskErrors asks a runtime-checkable Protocol whether the result has
        # errors: an isinstance that inspects the class on every operation.
        errors = getattr(result, "errors", None)
        if errors:
            result.errors = self._process_errors(errors)  # type: ignore[attr-defined]


def log_unexpected(errors: list[GraphQLError]) -> None:
    """Log what went wrong unexpectedly, with where it was raised; errors that are
    the client's to handle and validation errors are answers, not incidents."""
    for error in errors:
        if is_unexpected(error):
            log.error(
                "unexpected error at %s: %s",
                error.path,
                error.message,
                exc_info=error.original_error,
            )


P = ParamSpec("P")
R = TypeVar("R")


def answers_invalid_input(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """For a mutation whose result union has ``InvalidInput``: a request that
    fails its checks (nothing was written) is answered with that member."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except InvalidRequest as error:
            member = InvalidInput(
                code=ErrorCode.INVALID_INPUT, message=str(error), field=error.field
            )
            return cast(R, member)  # R is a union with InvalidInput among its members

    return wrapper
