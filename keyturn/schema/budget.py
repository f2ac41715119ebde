"""How large an answer may grow: the fields that can be large count their
values against the operation's ``KEYTURN_MAX_RESPONSE_BYTES`` as they resolve.

Only those fields pay (inputs and outputs of turns, event data, tool
arguments and results): a hook on every field would cost every query a
quarter of its speed (measured on a page of 100 events), and the small
fields cannot make an answer large — the cost rule bounds how many there are.
Once past the limit each further large field fails at once, nothing more is
read, and :class:`keyturn.schema.RequestLimits` answers the one
RESPONSE_TOO_LARGE error. A subscription's events are messages of their own,
each bounded by the cost rule: they are not added up.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from graphql import OperationType
from strawberry.extensions.field_extension import FieldExtension
from strawberry.types import Info

from keyturn.db.reads import RawJSON
from keyturn.errors import ResponseTooLarge


def size(value: Any) -> int:
    """About how many bytes ``value`` adds to the JSON answer."""
    if isinstance(value, RawJSON):  # JSON text passed on as it is (a page of events)
        value = value.text
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode())
    if isinstance(value, dict):  # JSON scalars (event data, tool arguments and results)
        return sum(size(k) + size(v) + 4 for k, v in value.items()) + 2
    if isinstance(value, list):
        return sum(size(v) + 1 for v in value) + 2
    return 8


def _charge(info: Info[Any, Any], value: Any) -> None:
    if info.operation.operation is OperationType.SUBSCRIPTION:
        return
    context = info.context
    context.response_bytes += size(value)
    if context.response_bytes > context.limits.max_response_bytes:
        context.response_too_large = True
        raise ResponseTooLarge(context.limits.max_response_bytes)


class CountsTowardResponse(FieldExtension):
    def resolve(
        self, next_: Callable[..., Any], source: Any, info: Info[Any, Any], **kwargs: Any
    ) -> Any:
        if info.context.response_too_large:
            raise ResponseTooLarge(info.context.limits.max_response_bytes)
        value = next_(source, info, **kwargs)
        _charge(info, value)
        return value

    async def resolve_async(
        self,
        next_: Callable[..., Awaitable[Any]],
        source: Any,
        info: Info[Any, Any],
        **kwargs: Any,
    ) -> Any:
        if info.context.response_too_large:
            raise ResponseTooLarge(info.context.limits.max_response_bytes)
        value = await next_(source, info, **kwargs)
        _charge(info, value)
        return value


def large() -> Any:
    """The field extensions of a field that can be large."""
    return [CountsTowardResponse()]
