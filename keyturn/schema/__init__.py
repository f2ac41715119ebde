"""The GraphQL schema: types, inputs, error types, and root types that only delegate."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from inspect import isawaitable
from typing import Any

import strawberry
from graphql import ASTValidationRule, GraphQLError, OperationType
from strawberry.extensions import (
    AddValidationRules,
    DisableIntrospection,
    MaxTokensLimiter,
    ParserCache,
    SchemaExtension,
    ValidationCache,
)
from strawberry.extensions.max_aliases import create_validator as alias_rule
from strawberry.extensions.query_depth_limiter import create_validator as depth_rule
from strawberry.types import ExecutionContext

from keyturn.schema.cost import cost_rule
from keyturn.schema.errors import PublicErrors, ResponseTooLarge, log_unexpected
from keyturn.schema.root import Mutation, Query, Subscription
from keyturn.schema.types import Event, Session, Turn


class KeyturnSchema(strawberry.Schema):
    def process_errors(
        self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None
    ) -> None:
        log_unexpected(errors)


# The deepest query the schema allows without introspection is 8 levels
# (sessions.edges.node.turns.edges.node.events.data); introspection's own
# cycles are bounded by graphql-core's MaxIntrospectionDepthRule.
MAX_DEPTH = 10


MAX_ALIASES = 30
MAX_TOKENS = 2000


def _size(value: Any) -> int:
    """About how many bytes ``value`` adds to the JSON answer. Objects count
    nothing here: their fields are counted as they resolve."""
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode())
    if isinstance(value, dict):  # JSON scalars (Event.data, tool arguments and results)
        return sum(_size(k) + _size(v) + 4 for k, v in value.items()) + 2
    if isinstance(value, list):
        return sum(_size(v) + 1 for v in value) + 2
    if value is None or isinstance(value, bool | int | float):
        return 8
    return 0


class RequestLimits(SchemaExtension):
    """The limits of one operation, from its context (the settings): its cost,
    checked with validation (keyturn.schema.cost), and its answer's size.

    The size adds up what every resolved field puts in the answer (its name
    and its value) as the result is built; once past the limit every field
    left fails at once, nothing more is read, and the answer is the one
    RESPONSE_TOO_LARGE error with no data. A subscription's events are each a
    message of their own, bounded by the cost rule: they are not added up.
    """

    def __init__(self) -> None:
        self.limit = 0
        self.size = 0
        self.exceeded = False

    def on_operation(self) -> Iterator[None]:
        limits = self.execution_context.context.limits
        self.limit = limits.max_response_bytes
        self.execution_context.validation_rules = (
            *self.execution_context.validation_rules,
            cost_rule(limits.max_query_cost),
        )
        yield

    def on_execute(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        if self.exceeded and result is not None:
            error = ResponseTooLarge(self.limit)
            result.data = None
            result.errors = [
                GraphQLError(str(error), original_error=error, extensions={"limit": self.limit})
            ]

    def resolve(
        self, _next: Callable[..., Any], root: Any, info: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if info.operation.operation == OperationType.SUBSCRIPTION:
            return _next(root, info, *args, **kwargs)
        if self.exceeded:
            raise ResponseTooLarge(self.limit)
        value = _next(root, info, *args, **kwargs)
        if isawaitable(value):
            return self._count_later(value, info.path.key)
        self._count(value, info.path.key)
        return value

    async def _count_later(self, value: Awaitable[Any], key: str) -> Any:
        result = await value
        self._count(result, key)
        return result

    def _count(self, value: Any, key: str) -> None:
        self.size += len(key) + 4 + _size(value)
        if self.size > self.limit:
            self.exceeded = True
            raise ResponseTooLarge(self.limit)


def build_schema(*, introspection: bool = True, max_depth: int = MAX_DEPTH) -> strawberry.Schema:
    # The depth and alias rules are built once per schema, not per request:
    # QueryDepthLimiter and MaxAliasesLimiter make a new rule class each time
    # they are constructed, and a new class per request means ValidationCache
    # (keyed by the rules) never hits. Measured: twice the submitTurn rate.
    # The cost rule joins them per operation (RequestLimits: its limit is a
    # setting), one class per limit for the same reason.
    rules: list[type[ASTValidationRule]] = [
        depth_rule(max_depth, None, None),
        alias_rule(MAX_ALIASES),
    ]
    extra: list[Any] = [] if introspection else [DisableIntrospection]
    return KeyturnSchema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        extensions=[
            *extra,
            lambda: ParserCache(maxsize=1024),
            lambda: AddValidationRules(rules),
            lambda: ValidationCache(maxsize=1024),
            lambda: MaxTokensLimiter(max_token_count=MAX_TOKENS),
            RequestLimits,
            PublicErrors,
        ],
    )


schema = build_schema()

__all__ = ["Event", "Session", "Turn", "build_schema", "schema"]
