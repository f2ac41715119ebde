"""The GraphQL schema: types, inputs, error types, and root types that only delegate."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import strawberry
from graphql import (
    ASTValidationRule,
    GraphQLError,
    OperationType,
    get_operation_ast,
)
from strawberry.extensions import DisableIntrospection, SchemaExtension
from strawberry.extensions.max_aliases import create_validator as alias_rule
from strawberry.extensions.query_depth_limiter import create_validator as depth_rule
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext, validate_document
from strawberry.types import ExecutionContext

from keyturn.errors import ResponseTooLarge
from keyturn.schema import budget
from keyturn.schema.cost import cost_rule
from keyturn.schema.documents import MAX_TOKENS as MAX_TOKENS
from keyturn.schema.documents import DocumentCache
from keyturn.schema.errors import PublicErrors, log_unexpected
from keyturn.schema.execution import FastLists
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


# Parsed and validated documents, by their text (keyturn.schema.documents).
DOCUMENTS = DocumentCache()


def operation_type(text: str, operation_name: str | None) -> OperationType | None:
    """Which kind of operation ``text`` asks to run, from the same parse the
    operation itself will use; None when it does not parse or names no
    operation (its execution then answers why)."""
    try:
        operation = get_operation_ast(DOCUMENTS.parse(text), operation_name)
    except GraphQLError:
        return None
    return operation.operation if operation is not None else None


class RequestLimits(SchemaExtension):
    """One operation from its text to its answer's size, in one extension.

    Parsing (at most MAX_TOKENS tokens) and validation (the schema's rules,
    the depth and alias limits, and the cost limit from the context's
    settings: keyturn.schema.cost) are done once per distinct document text
    and kept. The answer's size is added up by the large fields as they
    resolve (keyturn.schema.budget); past the size limit the answer is the
    one RESPONSE_TOO_LARGE error with no data."""

    def __init__(self, rules: tuple[type[ASTValidationRule], ...]) -> None:
        self.rules = rules
        self.parsed: str | None = None  # the text this operation's document came from
        self.budget: budget.Budget | None = None  # this operation's, once it starts

    def on_operation(self) -> Iterator[None]:
        limit = self.execution_context.context.limits.max_response_bytes
        self.budget = budget.start(limit)
        yield

    def on_parse(self) -> Iterator[None]:
        execution = self.execution_context
        if execution.graphql_document is None and execution.query:
            execution.graphql_document = DOCUMENTS.parse(execution.query)
            self.parsed = execution.query
        yield

    def on_validate(self) -> Iterator[None]:
        execution = self.execution_context
        document = execution.graphql_document
        assert document is not None
        rules = (
            *execution.validation_rules,
            *self.rules,
            cost_rule(execution.context.limits.max_query_cost),
        )
        schema = execution.schema._schema
        if self.parsed is not None:
            errors = DOCUMENTS.validate(
                self.parsed,
                document,
                (schema, rules),
                lambda doc: validate_document(schema, doc, rules),
            )
        else:
            errors = validate_document(schema, document, rules)
        execution.pre_execution_errors = errors
        yield

    def on_execute(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        if self.budget is not None and self.budget.exceeded and result is not None:
            limit = self.budget.limit
            error = ResponseTooLarge(limit)
            result.data = None
            result.errors = [
                GraphQLError(str(error), original_error=error, extensions={"limit": limit})
            ]


def build_schema(
    *, introspection: bool = True, max_depth: int = MAX_DEPTH, fast_lists: bool = True
) -> strawberry.Schema:
    """The schema; ``fast_lists=False`` completes every list on graphql-core's
    own path (keyturn.schema.execution), the reference its answers must equal."""
    # The depth and alias rules are built once per schema, not per request:
    # a rule class made per request would never find its cached validation.
    # The cost rule joins them per operation (its limit is a setting), one
    # class per limit for the same reason.
    rules = (depth_rule(max_depth, None, None), alias_rule(MAX_ALIASES))
    extra: list[Any] = [] if introspection else [DisableIntrospection]
    return KeyturnSchema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        execution_context_class=FastLists if fast_lists else StrawberryGraphQLCoreExecutionContext,
        extensions=[*extra, lambda: RequestLimits(rules), PublicErrors],
    )


schema = build_schema()

__all__ = ["Event", "Session", "Turn", "build_schema", "operation_type", "schema"]
