"""The GraphQL schema: types, inputs, error types, and root types that only delegate."""

from __future__ import annotations

import logging
from typing import Any

import strawberry
from graphql import ASTValidationRule, GraphQLError
from strawberry.extensions import (
    AddValidationRules,
    DisableIntrospection,
    MaskErrors,
    MaxTokensLimiter,
    ParserCache,
    ValidationCache,
)
from strawberry.extensions.max_aliases import create_validator as alias_rule
from strawberry.extensions.query_depth_limiter import create_validator as depth_rule
from strawberry.types import ExecutionContext

from keyturn.resolvers.errors import PublicError
from keyturn.schema.root import Mutation, Query, Subscription
from keyturn.schema.types import Event, Session, Turn

log = logging.getLogger("keyturn.errors")


def _is_unexpected(error: GraphQLError) -> bool:
    original = error.original_error
    # parse/validation errors carry no original error; PublicErrors are meant for clients
    return original is not None and not isinstance(original, PublicError)


def _should_mask(error: GraphQLError) -> bool:
    return _is_unexpected(error)


def _format_public(error: GraphQLError) -> None:
    original = error.original_error
    if isinstance(original, PublicError):
        error.extensions = {**(error.extensions or {}), **original.extensions()}


class PublicErrorExtensions(MaskErrors):
    """Masks unexpected errors; gives expected ones their code and retryable flag."""

    def _process_errors(self, errors: list[GraphQLError]) -> list[GraphQLError]:
        for error in errors:
            _format_public(error)
        return super()._process_errors(errors)


class KeyturnSchema(strawberry.Schema):
    def process_errors(
        self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None
    ) -> None:
        """Log what went wrong unexpectedly, with its traceback; errors that are
        the client's to handle (bad arguments, not found, retry later) and
        validation errors are answers, not incidents."""
        for error in errors:
            if _is_unexpected(error):
                log.error(
                    "unexpected error at %s: %s",
                    error.path,
                    error.message,
                    exc_info=error.original_error,
                )


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
            lambda: PublicErrorExtensions(should_mask_error=_should_mask),
        ],
    )


schema = build_schema()

__all__ = ["Event", "Session", "Turn", "build_schema", "schema"]
