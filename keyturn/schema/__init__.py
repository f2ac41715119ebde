"""The GraphQL schema: types, inputs, error types, and root types that only delegate."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator
from contextlib import aclosing
from typing import Any, cast

import strawberry
from graphql import (
    ASTValidationRule,
    DocumentNode,
    GraphQLError,
    GraphQLSchema,
    OperationType,
    get_operation_ast,
    specified_rules,
    subscribe,
)
from graphql import ExecutionResult as CoreResult
from graphql.execution import Executor, ExperimentalIncrementalExecutionResults
from graphql.execution.execute import UNEXPECTED_EXPERIMENTAL_DIRECTIVES
from graphql.execution.executor import UNEXPECTED_MULTIPLE_PAYLOADS
from strawberry.exceptions import MissingQueryError
from strawberry.execution import optimized_is_awaitable
from strawberry.extensions import DisableIntrospection, SchemaExtension
from strawberry.extensions.max_aliases import create_validator as alias_rule
from strawberry.extensions.query_depth_limiter import create_validator as depth_rule
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.schema.schema import (
    DEFAULT_ALLOWED_OPERATION_TYPES,
    StrawberryGraphQLCoreExecutionContext,
    validate_document,
)
from strawberry.types import ExecutionContext, ExecutionResult
from strawberry.types.execution import PreExecutionError
from strawberry.types.graphql import OperationType as StrawberryOperation
from strawberry.utils.await_maybe import await_maybe
from strawberry.utils.operation import get_first_operation, get_operation_type

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
    # What build_schema's extensions do, for run_operation; None on a schema
    # built any other way, whose operations all take Strawberry's execute.
    plain: Plain | None = None
    # Subscriptions take the same plain path (stream); False sends them
    # through Strawberry's own, the reference they are tested against.
    plain_streams: bool = True

    def process_errors(
        self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None
    ) -> None:
        log_unexpected(errors)

    async def run_operation(
        self,
        query: str | None,
        *,
        variable_values: dict[str, Any] | None,
        context_value: Any,
        root_value: Any,
        operation_name: str | None,
        allowed_operation_types: Iterable[StrawberryOperation],
        operation_extensions: dict[str, Any] | None,
    ) -> ExecutionResult:
        """What ``execute`` answers for one query or mutation, the same result,
        errors, masking, logging and exceptions, without Strawberry's extension
        runner: build_schema's extensions (RequestLimits, PublicErrors and
        DisableIntrospection's rule) are done here in the order the runner
        calls their hooks. The runner's layers (an execution context, four
        context managers and a hook lookup per extension, a middleware manager)
        were a sixth of the CPU of a replayed submitTurn (0.74 against 0.62 ms,
        interleaved pairs) and a twelfth of a page of 100 events'."""
        plain = self.plain
        if plain is None:
            return await self.execute(
                query,
                variable_values=variable_values,
                context_value=context_value,
                root_value=root_value,
                operation_name=operation_name,
                allowed_operation_types=allowed_operation_types,
                operation_extensions=operation_extensions,
            )
        try:
            # RequestLimits.on_operation.
            limits = context_value.limits
            spending = budget.start(limits.max_response_bytes)
            # Schema.execute: parsing, the operation's type, validation.
            if not query:
                raise MissingQueryError
            document = DOCUMENTS.parse(query)
            name = operation_name if operation_name is not None else _first_name(document)
            try:
                kind = get_operation_type(document, name)
            except RuntimeError as error:
                raise CannotGetOperationTypeError(name) from error
            if kind not in allowed_operation_types:
                raise InvalidOperationTypeError(kind)
            errors = validated(self, query, document, plain.rules(limits.max_query_cost))
            if errors:
                self._process_errors(errors)
                found: ExecutionResult | CoreResult = PreExecutionError(
                    data=None, errors=errors, extensions={}
                )
            else:
                # Strawberry's middleware manager holds no middleware here
                # (no extension resolves): None does the same, and is one
                # call less per field.
                outcome = _execute(
                    self._schema,
                    document,
                    self.execution_context_class,
                    root_value=root_value,
                    variable_values=variable_values,
                    operation_name=name,
                    context_value=context_value,
                    operation_extensions=operation_extensions,
                )
                done = outcome if isinstance(outcome, CoreResult) else await outcome
                if not isinstance(done, CoreResult):
                    raise GraphQLError(UNEXPECTED_MULTIPLE_PAYLOADS)
                if done.errors:
                    self._process_errors(done.errors)
                # RequestLimits.on_execute.
                too_large(spending, done)
                found = done
            # PublicErrors.on_operation, then Schema.execute's own result.
            plain.public._process_result(found)
            if isinstance(found, ExecutionResult):
                return found
            return ExecutionResult(data=found.data, errors=found.errors, extensions={})
        except (MissingQueryError, CannotGetOperationTypeError, InvalidOperationTypeError):
            raise
        except Exception as error:
            # As Schema.execute answers an error that escaped the operation:
            # logged, and unmasked (PublicErrors never saw it).
            coerced = [_coerced(error)]
            self._process_errors(coerced)
            return PreExecutionError(data=None, errors=coerced, extensions={})

    async def stream(  # Strawberry's signature
        self,
        query: str | None,
        variable_values: dict[str, Any] | None = None,
        context_value: Any | None = None,
        root_value: Any | None = None,
        operation_name: str | None = None,
        operation_extensions: dict[str, Any] | None = None,
        allowed_operation_types: Iterable[StrawberryOperation] | None = None,
    ) -> Any:
        """A subscription's results as Strawberry's ``stream`` yields them (the
        same results, errors, masking and logging), without its extension
        runner: see :meth:`_subscription`. Anything else (a query or mutation
        over a stream, a document that does not parse or names no operation
        it holds) takes Strawberry's own path, which answers it as before."""
        plain = self.plain if self.plain_streams else None
        if plain is not None and query:
            try:
                document = DOCUMENTS.parse(query)
                name = operation_name if operation_name is not None else _first_name(document)
                kind = get_operation_type(document, name)
            except Exception:  # Strawberry's path gives its answer
                kind = None
            allowed = (
                DEFAULT_ALLOWED_OPERATION_TYPES
                if allowed_operation_types is None
                else allowed_operation_types
            )
            if kind is StrawberryOperation.SUBSCRIPTION and kind in allowed:
                return self._subscription(
                    plain,
                    query,
                    document,
                    name,
                    variable_values=variable_values,
                    context_value=context_value,
                    root_value=root_value,
                    operation_extensions=operation_extensions,
                )
        return await super().stream(
            query,
            variable_values=variable_values,
            context_value=context_value,
            root_value=root_value,
            operation_name=operation_name,
            operation_extensions=operation_extensions,
            allowed_operation_types=allowed_operation_types,
        )

    async def _subscription(
        self,
        plain: Plain,
        query: str,
        document: DocumentNode,
        name: str | None,
        *,
        variable_values: dict[str, Any] | None,
        context_value: Any,
        root_value: Any,
        operation_extensions: dict[str, Any] | None,
    ) -> AsyncIterator[ExecutionResult]:
        """Strawberry's ``_stream`` for a subscription, with build_schema's
        extensions done in the order its runner calls their hooks. When a
        turn ends, every listener of it takes a result from here at once:
        the runner's layers around each one (a context manager and a hook
        lookup per extension, the extensions' results gathered) were a tenth
        of what a delivery cost a server (bench/README.md, "A subscription's
        results without Strawberry's extension runner")."""
        # RequestLimits.on_operation: the budget the large fields charge.
        limits = context_value.limits
        budget.start(limits.max_response_bytes)
        # RequestLimits.on_validate (the document was parsed by DOCUMENTS).
        errors = validated(self, query, document, plain.rules(limits.max_query_cost))
        if errors:
            yield self._streamed(plain, PreExecutionError(data=None, errors=errors))
            return
        try:
            source = await await_maybe(
                subscribe(
                    self._schema,
                    document,
                    root_value=root_value,
                    variable_values=variable_values,
                    operation_name=name,
                    context_value=context_value,
                    executor_class=self.execution_context_class,
                    operation_extensions=operation_extensions,
                )
            )
        except Exception as error:  # answered as Strawberry answers it
            yield self._streamed(plain, CoreResult(data=None, errors=[_coerced(error)]))
            return
        if isinstance(source, CoreResult):
            # Refused before the first event (its variables, its resolver).
            yield self._streamed(plain, PreExecutionError(data=None, errors=source.errors))
            return
        events = cast(AsyncGenerator[CoreResult, None], source)
        try:
            async with aclosing(events):
                async for event in events:
                    yield self._streamed(plain, event)
        # graphql-core does not answer what its event stream raises.
        except Exception as error:
            yield self._streamed(plain, CoreResult(data=None, errors=[_coerced(error)]))

    def _streamed(self, plain: Plain, result: ExecutionResult | CoreResult) -> ExecutionResult:
        """Schema._handle_execution_result, then PublicErrors.on_stream_result."""
        if result.errors:
            self._process_errors(result.errors)
        found = (
            ExecutionResult(data=result.data, errors=result.errors)
            if isinstance(result, CoreResult)
            else result
        )
        # None of build_schema's extensions adds results of its own.
        found.extensions = {}
        plain.public._process_result(found)
        return found


def _execute(
    schema: GraphQLSchema,
    document: DocumentNode,
    executor_class: type[Executor[Any]],
    *,
    root_value: Any,
    variable_values: dict[str, Any] | None,
    operation_name: str | None,
    context_value: Any,
    operation_extensions: dict[str, Any] | None,
) -> Any:
    """graphql-core's ``execute`` for what run_operation gives it: the same
    checks, the same executor and the same result, without the two calls it
    passes some twenty arguments through (``execute``, then
    ``experimental_execute_incrementally``) or the coroutine it wraps the
    awaited result in; run_operation tests that result as that coroutine
    would."""
    if schema.get_directive("defer") or schema.get_directive("stream"):
        raise GraphQLError(UNEXPECTED_EXPERIMENTAL_DIRECTIVES)
    executor = executor_class.build(
        schema,
        document,
        root_value,
        context_value,
        variable_values,
        operation_name,
        # Strawberry's, typed as a plain bool predicate.
        is_awaitable=cast(Any, optimized_is_awaitable),
        operation_extensions=operation_extensions,
    )
    if isinstance(executor, list):
        return CoreResult(None, errors=executor)
    result = executor.execute_operation()
    if isinstance(result, ExperimentalIncrementalExecutionResults):
        raise GraphQLError(UNEXPECTED_MULTIPLE_PAYLOADS)
    return result


def _coerced(error: Exception) -> GraphQLError:
    """An error that escaped an operation, as Strawberry answers it."""
    return (
        error if isinstance(error, GraphQLError) else GraphQLError(str(error), original_error=error)
    )


def _first_name(document: DocumentNode) -> str | None:
    # Strawberry's ExecutionContext.operation_name without a name given.
    first = get_first_operation(document)
    return first.name.value if first is not None and first.name is not None else None


class Plain:
    """build_schema's extensions, for KeyturnSchema.run_operation: the rules
    an operation is validated with per cost limit, and the masking."""

    __slots__ = ("_by_cost", "base", "public")

    def __init__(self, base: tuple[type[ASTValidationRule], ...]) -> None:
        # Strawberry's default rules, DisableIntrospection's, then RequestLimits':
        # the same tuple, so the same validation kept in DOCUMENTS.
        self.base = base
        self.public = PublicErrors()
        self._by_cost: dict[int, tuple[type[ASTValidationRule], ...]] = {}

    def rules(self, max_cost: int) -> tuple[type[ASTValidationRule], ...]:
        found = self._by_cost.get(max_cost)
        if found is None:
            found = self._by_cost[max_cost] = (*self.base, cost_rule(max_cost))
        return found


def validated(
    schema: strawberry.Schema,
    text: str | None,
    document: DocumentNode,
    rules: tuple[type[ASTValidationRule], ...],
) -> list[GraphQLError]:
    """``document``'s validation errors against ``rules``, kept with its text
    when it came from DOCUMENTS (``text``), else validated now."""
    core = schema._schema
    if text is not None:
        return DOCUMENTS.validate(
            text, document, (core, rules), lambda doc: validate_document(core, doc, rules)
        )
    return validate_document(core, document, rules)


def too_large(spending: budget.Budget | None, result: Any) -> None:
    """An answer past the size limit is the one RESPONSE_TOO_LARGE error, no data."""
    if spending is not None and spending.exceeded and result is not None:
        limit = spending.limit
        error = ResponseTooLarge(limit)
        result.data = None
        result.errors = [
            GraphQLError(str(error), original_error=error, extensions={"limit": limit})
        ]


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
        execution.pre_execution_errors = validated(execution.schema, self.parsed, document, rules)
        yield

    def on_execute(self) -> Iterator[None]:
        yield
        too_large(self.budget, self.execution_context.result)


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
    built = KeyturnSchema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        execution_context_class=FastLists if fast_lists else StrawberryGraphQLCoreExecutionContext,
        extensions=[*extra, lambda: RequestLimits(rules), PublicErrors],
    )
    # What those extensions do, for run_operation. Only without schema
    # directives: Strawberry adds an extension of its own for them.
    if not built.directives and not built.config.enable_experimental_incremental_execution:
        hidden = () if introspection else tuple(DisableIntrospection().validation_rules)
        built.plain = Plain((*specified_rules, *hidden, *rules))
    return built


schema = build_schema()

__all__ = ["Event", "Session", "Turn", "build_schema", "operation_type", "schema"]
