"""The GraphQL schema: types, inputs, error types, and root types that only delegate."""

from __future__ import annotations

import logging

import strawberry
from graphql import GraphQLError
from strawberry.extensions import (
    MaskErrors,
    MaxAliasesLimiter,
    MaxTokensLimiter,
    ParserCache,
    QueryDepthLimiter,
    ValidationCache,
)

from keyturn.resolvers.errors import PublicError
from keyturn.schema.root import Mutation, Query, Subscription
from keyturn.schema.types import Event, Session, Turn

log = logging.getLogger("keyturn.errors")


def _should_mask(error: GraphQLError) -> bool:
    original = error.original_error
    if original is None or isinstance(original, PublicError):
        return False  # parse/validation errors and errors meant for clients
    log.error("unexpected error in %s", error.path, exc_info=original)
    return True


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


def build_schema() -> strawberry.Schema:
    return strawberry.Schema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        extensions=[
            lambda: ParserCache(maxsize=1024),
            lambda: ValidationCache(maxsize=1024),
            lambda: QueryDepthLimiter(max_depth=12),
            lambda: MaxAliasesLimiter(max_alias_count=30),
            lambda: MaxTokensLimiter(max_token_count=2000),
            lambda: PublicErrorExtensions(should_mask_error=_should_mask),
        ],
    )


schema = build_schema()

__all__ = ["Event", "Session", "Turn", "build_schema", "schema"]
