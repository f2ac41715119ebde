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

Each operation has its own :class:`Budget`, in a context variable set when
it starts: the operations of one WebSocket share one GraphQL context, and
run at once, but one's answer never spends another's budget.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
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


@dataclass(slots=True)
class Budget:
    """What one operation's large fields have put in its answer so far, in bytes."""

    limit: int
    spent: int = 0
    exceeded: bool = False

    def check(self) -> None:
        """Once past the limit, every further large field fails before it is read."""
        if self.exceeded:
            raise ResponseTooLarge(self.limit)

    def charge(self, value: Any) -> None:
        if self.exceeded:
            raise ResponseTooLarge(self.limit)
        if type(value) is RawJSON:  # an event's data: a page charges a hundred
            text = value.text
            self.spent += len(text) if text.isascii() else len(text.encode())
        else:
            self.spent += size(value)
        if self.spent > self.limit:
            self.exceeded = True
            raise ResponseTooLarge(self.limit)


# The running operation's budget: a task and the tasks it starts (graphql-core
# gathers fields in tasks) see the one its operation set.
_BUDGET: ContextVar[Budget | None] = ContextVar("keyturn_response_budget", default=None)


def start(limit: int) -> Budget:
    """A new budget for the operation starting in this task."""
    budget = Budget(limit)
    _BUDGET.set(budget)
    return budget


def running() -> Budget | None:
    """The budget of the operation running in this task, if one is."""
    return _BUDGET.get()


def current(info: Info[Any, Any]) -> Budget | None:
    """The budget a large field of this operation charges; None for a
    subscription's events (or outside an operation)."""
    if info.operation.operation is OperationType.SUBSCRIPTION:
        return None
    return _BUDGET.get()


class CountsTowardResponse(FieldExtension):
    def resolve(
        self, next_: Callable[..., Any], source: Any, info: Info[Any, Any], **kwargs: Any
    ) -> Any:
        budget = current(info)
        if budget is None:
            return next_(source, info, **kwargs)
        budget.check()
        value = next_(source, info, **kwargs)
        budget.charge(value)
        return value

    async def resolve_async(
        self,
        next_: Callable[..., Awaitable[Any]],
        source: Any,
        info: Info[Any, Any],
        **kwargs: Any,
    ) -> Any:
        budget = current(info)
        if budget is None:
            return await next_(source, info, **kwargs)
        budget.check()
        value = await next_(source, info, **kwargs)
        budget.charge(value)
        return value


def large() -> Any:
    """The field extensions of a field that can be large."""
    return [CountsTowardResponse()]
