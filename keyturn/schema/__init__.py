"""The GraphQL schema: types, inputs, error types, and root types that only delegate."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import strawberry
from graphql import ASTValidationRule, GraphQLError
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

from keyturn.errors import ResponseTooLarge
from keyturn.schema.cost import cost_rule
from keyturn.schema.errors import PublicErrors, log_unexpected
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


class RequestLimits(SchemaExtension):
    """The limits of one operation, from its context (the settings): its cost,
    checked with validation (keyturn.schema.cost), and its answer's size,
    added up by the large fields as they resolve (keyturn.schema.budget).
    Past the size limit the answer is the one RESPONSE_TOO_LARGE error with
    no data."""

    def on_operation(self) -> Iterator[None]:
        context = self.execution_context.context
        context.response_bytes = 0
        context.response_too_large = False
        self.execution_context.validation_rules = (
            *self.execution_context.validation_rules,
            cost_rule(context.limits.max_query_cost),
        )
        yield

    def on_execute(self) -> Iterator[None]:
        yield
        context = self.execution_context.context
        result = self.execution_context.result
        if context.response_too_large and result is not None:
            limit = context.limits.max_response_bytes
            error = ResponseTooLarge(limit)
            result.data = None
            result.errors = [
                GraphQLError(str(error), original_error=error, extensions={"limit": limit})
            ]


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
