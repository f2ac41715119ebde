"""The GraphQL schema: types, inputs, error types, and root types that only delegate."""

from __future__ import annotations

from typing import Any

import strawberry
from graphql import ASTValidationRule, GraphQLError
from strawberry.extensions import (
    AddValidationRules,
    DisableIntrospection,
    MaxTokensLimiter,
    ParserCache,
    ValidationCache,
)
from strawberry.extensions.max_aliases import create_validator as alias_rule
from strawberry.extensions.query_depth_limiter import create_validator as depth_rule
from strawberry.types import ExecutionContext

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


def build_schema(*, introspection: bool = True, max_depth: int = MAX_DEPTH) -> strawberry.Schema:
    # The depth and alias rules are built once per schema, not per request:
    # QueryDepthLimiter and MaxAliasesLimiter make a new rule class each time
    # they are constructed, and a new class per request means ValidationCache
    # (keyed by the rules) never hits. Measured: twice the submitTurn rate.
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
            PublicErrors,
        ],
    )


schema = build_schema()

__all__ = ["Event", "Session", "Turn", "build_schema", "schema"]
