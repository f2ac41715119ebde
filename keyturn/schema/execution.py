"""Lists of plain objects completed in one pass, not field by field.

graphql-core completes every field of every item of a list on its own: a
page of 100 events selecting ``cursor node { seq type data }`` is some 500
resolver calls, resolve infos and completions, most of a page request's time.
When every field the document selects on a list's items is a plain attribute
(no resolver, no arguments; a leaf, ``__typename``, or a plain object of the
same kind), :class:`FastLists` builds each item's answer straight from its
attributes with a plan compiled once for that selection
(keyturn.schema.plans) and kept across operations. Only what the document
selects is read.

Anything else takes graphql-core's own path, and so does any list where one
item would not complete cleanly (a null in a non-null field, a value its
scalar refuses, an attribute that raises): that path then gives the error
with its exact path and message. A large field (keyturn.schema.budget) is charged as its extension
charges it, so a page past the size limit answers as before.

A subscription's event is completed once for all the listeners it reaches
with the same document and variables (:class:`_Deliveries`): a turn's end
wakes every listener of it, and each completing the same selection on the
same record was an eighth of the delivery's time.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from graphql import (
    DocumentNode,
    ExecutionResult,
    ExperimentalIncrementalExecutionResults,
    GraphQLError,
    GraphQLLeafType,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLResolveInfo,
    GraphQLResolveInfoHelpers,
    GraphQLSchema,
    OperationType,
    assert_valid_schema,
    is_leaf_type,
    is_object_type,
)
from graphql.execution import Executor, default_field_resolver, default_type_resolver
from graphql.execution.collect_fields import FieldDetailsList, collect_fields
from graphql.execution.middleware import MiddlewareManager
from graphql.language import (
    FieldNode,
    FragmentSpreadNode,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
)
from graphql.pyutils import AwaitableOrValue, Path, gather_with_cancel
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.schema.schema_converter import GraphQLCoreConverter

from keyturn.schema.budget import Budget, CountsTowardResponse
from keyturn.schema.budget import running as current_budget
from keyturn.schema.operations import Run, compile_operation
from keyturn.schema.plans import (
    PLANS,
    Build,
    Field,
    Plans,
    Shape,
    Unfit,
    compile_shape,
    no_charge,
)
from keyturn.schema.prepared import Prepared, prepare

_NO_PLAN = object()

# How long an event's answer is kept for the other listeners it reaches.
# Not one loop iteration: the listeners of one turn woken by its end queue
# on their session's lock in the bus (keyturn.runtime.bus) and pass it one
# after another, each woken by the one before, so a delivery to a hundred
# of them spans about a hundred iterations. The bus keeps the record
# itself twice as long (SharedReads), so this holds nothing much longer
# than it lives anyway, and the answer's strings are the record's own.
KEEP_S = 1.0
MAX_KEPT = 1024


@dataclass(slots=True)
class _Answer:
    record: Any
    operation: OperationDefinitionNode
    # None when the answer is the listener's own to compute: it has errors,
    # or the selection reads more than the event (a resolver, a middleware).
    data: dict[str, Any] | None
    at: float


class _Deliveries:
    """Answers to subscription events, by the record the event was built
    from, the operation and its variables, kept a moment.

    The listeners of one turn that subscribed with the same document (one
    parsed DocumentNode, from keyturn.schema.DOCUMENTS) and the same
    variables get the same record (keyturn.runtime.streams shares one read
    of it), and, when the document selects only plain attributes of it, the
    same answer: it is completed once and its ``data`` given to each (no
    consumer changes it: Strawberry's handlers only serialize it). A key
    holds its record and operation, so their ids cannot be reused while it
    is kept."""

    __slots__ = ("_kept", "_loop", "_timer", "executed", "shared")

    def __init__(self) -> None:
        self._kept: dict[Hashable, _Answer] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        # Events completed by graphql-core, and events answered with another
        # listener's completion.
        self.executed = 0
        self.shared = 0

    def find(
        self, key: Hashable, record: Any, operation: OperationDefinitionNode
    ) -> _Answer | None:
        found = self._kept.get(key)
        if (
            found is None
            or found.record is not record
            or found.operation is not operation
            or time.monotonic() - found.at >= KEEP_S
        ):
            return None
        return found

    def keep(self, key: Hashable, answer: _Answer) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # nothing would expire it
            return
        kept = self._kept
        kept.pop(key, None)  # insertion order stays the order of `at`
        kept[key] = answer
        while len(kept) > MAX_KEPT:
            del kept[next(iter(kept))]
        if self._timer is None or self._loop is not loop:
            # A timer of a loop that has since ended would never run.
            self._loop = loop
            self._timer = loop.call_later(KEEP_S, self._expire)

    def _expire(self) -> None:
        self._timer = None
        kept = self._kept
        cutoff = time.monotonic() - KEEP_S
        while kept:
            oldest = next(iter(kept))
            if kept[oldest].at > cutoff:
                break
            del kept[oldest]
        if kept and self._loop is not None:
            first = next(iter(kept.values()))
            self._timer = self._loop.call_later(
                max(0.0, first.at + KEEP_S - time.monotonic()), self._expire
            )


DELIVERIES = _Deliveries()


class Replay:
    """The middleware of graphql-core's run of a query whose plan gave up:
    a resolver the plan already called answers what it answered then (its
    value, or its exception raised again), by its path; any other resolver
    is called."""

    __slots__ = ("_by_path",)

    def __init__(self, outcomes: list[tuple[Path, bool, Any]]) -> None:
        self._by_path = {tuple(path.as_list()): (ok, value) for path, ok, value in outcomes}

    def resolve(self, next_: Any, root: Any, info: GraphQLResolveInfo[Any], **args: Any) -> Any:
        found = self._by_path.get(tuple(info.path.as_list()))
        if found is None:
            return next_(root, info, **args)
        ok, value = found
        if ok:
            return value
        raise value


def _nothing() -> None:
    pass


class _Planned:
    """Queries answered by their compiled plan, and plans that gave up to
    graphql-core (which then executed the query, given what the resolvers
    the plan had called gave: Replay)."""

    __slots__ = ("answered", "gave_up")

    def __init__(self) -> None:
        self.answered = 0
        self.gave_up = 0


PLANNED = _Planned()
# Compiled queries, by the schema and the operation's node.
OPERATIONS = Plans(limit=1024)
# Documents' operations prepared for execution (keyturn.schema.prepared), by
# the schema and the document, then by the operation's name.
PREPARED = Plans(limit=1024)


def _frozen(value: Any) -> Hashable:
    """A hashable form of coerced variable values; TypeError when one is not.
    Types are kept: 1, 1.0 and True are equal, but not the same answer."""
    if isinstance(value, dict):
        return (dict, tuple(sorted((k, _frozen(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        return (list, tuple(_frozen(v) for v in value))
    hash(value)
    return (type(value), value)


def _gather_async_work(values: Sequence[Awaitable[Any]]) -> Awaitable[list[Any]]:
    # graphql-core's gather_async_work, which reads nothing of its context.
    return gather_with_cancel(*values)


def _weakly_bound(track: Callable[[Sequence[Any]], None]) -> Callable[[Sequence[Any]], None]:
    method = weakref.WeakMethod(track)

    def weakly(values: Sequence[Any]) -> None:
        bound = method()
        if bound is not None:
            bound(values)
            return
        # Its operation is over, and nothing will wait for this work: settled
        # in the background all the same, so its errors are still observed.
        pending = [value for value in values if inspect.isawaitable(value)]
        if pending:
            _ORPHANS.add(future := asyncio.gather(*pending, return_exceptions=True))
            future.add_done_callback(_ORPHANS.discard)

    return weakly


_ORPHANS: set[asyncio.Future[Any]] = set()


def _prepared(
    schema: GraphQLSchema, document: DocumentNode, operation_name: str | None
) -> Prepared | None:
    held = (schema, document)
    found, by_name = PREPARED.get(held)
    if not found:
        # Asserted once here, as graphql-core's build asserts it every time.
        assert_valid_schema(schema)
        by_name = {}
        PREPARED.keep(held, by_name)
    if operation_name in by_name:
        return cast(Prepared | None, by_name[operation_name])
    prepared = prepare(schema, document, operation_name)
    if len(by_name) < _NAMES_KEPT:  # names are the client's to choose
        by_name[operation_name] = prepared
    return prepared


# Operation names kept per document: a document rarely holds more than a
# few operations, and a name that picks none is kept too.
_NAMES_KEPT = 16


class FastLists(StrawberryGraphQLCoreExecutionContext):
    # Slots for the attributes graphql-core (3.3), Strawberry and this class
    # set on an execution context: 33, past what an instance's shared-key
    # dict holds, so each operation had a dict of its own (1.6 KiB), kept
    # for as long as a subscription waits. One a later version adds goes to
    # the instance's dict, as before.
    __slots__ = (
        "_deferred_execution_plans",
        "_initial_execution_plans",
        "_plans",
        "_relevant_sub_fields",
        "_stream_usages",
        "abort_signal",
        "async_helpers",
        "async_work_finished_hook_task",
        "background_futures",
        "collected_errors",
        "context_value",
        "defer_usage_set",
        "enable_early_execution",
        "error_propagation",
        "field_resolver",
        "fragment_definitions",
        "fragments",
        "groups",
        "hide_suggestions",
        "hooks",
        "is_async_iterable",
        "is_awaitable",
        "middleware_manager",
        "operation",
        "operation_extensions",
        "outcomes",
        "pending_incremental_futures",
        "root_value",
        "schema",
        "streams",
        "subscribe_field_resolver",
        "tasks",
        "type_resolver",
        "variable_values",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # graphql-core's helpers for resolvers are this context's bound
        # methods, kept on this context: a reference cycle, so everything an
        # operation made (a page's events, its answer, the request) outlived
        # it until the cycle collector found it, and under load a quarter of a
        # page's CPU went to that collector. Bound weakly, it all goes when
        # the operation's last reference does.
        self.async_helpers = GraphQLResolveInfoHelpers(
            gather=_gather_async_work, track=_weakly_bound(self.track_async_work)
        )
        # What the resolvers a query's plan called gave, by their paths.
        self.outcomes: list[tuple[Path, bool, Any]] = []
        self._plans: dict[tuple[str, int, int], tuple[FieldDetailsList, Any]] = {}

    @classmethod
    def build(
        cls,
        schema: GraphQLSchema,
        document: DocumentNode,
        root_value: Any = None,
        context_value: Any = None,
        raw_variable_values: dict[str, Any] | None = None,
        operation_name: str | None = None,
        field_resolver: Any = None,
        type_resolver: Any = None,
        subscribe_field_resolver: Any = None,
        max_coercion_errors: int = 50,
        enable_early_execution: bool = False,
        middleware: Any = None,
        is_awaitable: Any = None,
        is_async_iterable: Any = None,
        hide_suggestions: bool = False,
        abort_signal: Any = None,
        hooks: Any = None,
        **custom_args: Any,
    ) -> list[GraphQLError] | Executor[Any]:
        """graphql-core's ``build``, with what it works out from the document
        alone done once per document (keyturn.schema.prepared). Where the
        prepared operation does not answer (an error to report, a
        middleware given), graphql-core's own ``build`` runs."""
        variables = None
        prepared = _prepared(schema, document, operation_name) if middleware is None else None
        if prepared is not None:
            variables = prepared.variables(raw_variable_values or {})
        if prepared is None or variables is None:
            return super().build(
                schema,
                document,
                root_value,
                context_value,
                raw_variable_values,
                operation_name,
                field_resolver,
                type_resolver,
                subscribe_field_resolver,
                max_coercion_errors,
                enable_early_execution,
                middleware,
                is_awaitable,
                is_async_iterable,
                hide_suggestions=hide_suggestions,
                abort_signal=abort_signal,
                hooks=hooks,
                **custom_args,
            )
        return cls(
            schema,
            prepared.fragment_definitions,
            prepared.fragments,
            root_value,
            context_value,
            prepared.operation,
            variables,
            field_resolver or default_field_resolver,
            type_resolver or default_type_resolver,
            subscribe_field_resolver or default_field_resolver,
            enable_early_execution,
            None,
            is_awaitable,
            is_async_iterable,
            hide_suggestions=hide_suggestions,
            abort_signal=abort_signal,
            hooks=hooks,
            **custom_args,
        )

    def execute_operation(
        self, serially: bool | None = None
    ) -> AwaitableOrValue[ExecutionResult | ExperimentalIncrementalExecutionResults]:
        kind = self.operation.operation
        if kind is not OperationType.SUBSCRIPTION:
            run = self._operation_plan()
            if run is not None:
                return self._planned(run, serially)
            return super().execute_operation(serially)
        # A subscription's event: keyturn's (Turn, Event) are built from
        # their record alone (from_record), and keep it as ``_record``.
        record = getattr(self.root_value, "_record", None)
        key: Hashable | None = None
        if record is not None:
            try:
                variables = _frozen(self.variable_values.coerced)
            except TypeError:
                pass
            else:
                key = (id(record), type(self.root_value), id(self.operation), variables)
        if key is None:
            DELIVERIES.executed += 1
            return super().execute_operation(serially)
        found = DELIVERIES.find(key, record, self.operation)
        if found is not None:
            if found.data is not None:
                DELIVERIES.shared += 1
                # A result of its own (a consumer may set its attributes);
                # the data is the same.
                return ExecutionResult(found.data, None)
            DELIVERIES.executed += 1
            return super().execute_operation(serially)
        DELIVERIES.executed += 1
        result = super().execute_operation(serially)
        shared = (
            result.data
            if isinstance(result, ExecutionResult)
            and not result.errors
            and result.data is not None
            and self._answers_from_event_alone()
            else None
        )
        DELIVERIES.keep(key, _Answer(record, self.operation, shared, time.monotonic()))
        return result

    def _operation_plan(self) -> Run | None:
        """This query's or mutation's compiled plan (keyturn.schema.operations),
        kept with its operation; None where graphql-core runs it: a directive
        anywhere (the variables would decide what is selected), an abort
        signal, anything wrapping the resolvers, or a mutation of more than
        one root field (run one after another, which a plan does not do)."""
        manager = self.middleware_manager
        if (manager is not None and manager.middlewares) or self.hooks is not None:
            return None
        if self.abort_signal is not None or self.operation.directives:
            return None
        held = (self.schema, self.operation)
        found, run = OPERATIONS.get(held)
        if found:
            return cast(Run | None, run)
        run = None if self._directed(self.operation.selection_set) else compile_operation(self)
        OPERATIONS.keep(held, run)
        return run

    def _planned(
        self, run: Run, serially: bool | None
    ) -> AwaitableOrValue[ExecutionResult | ExperimentalIncrementalExecutionResults]:
        """``run``'s answer, or, where it gave up, graphql-core's: given what
        the resolvers the plan called gave (Replay), with the response budget
        as it was before the plan spent any."""
        charge, undo = self._charging()

        def again() -> AwaitableOrValue[ExecutionResult | ExperimentalIncrementalExecutionResults]:
            # The large fields are plain attributes, charged by the plan or
            # by their own extension, never by a resolver the plan called:
            # graphql-core charges each of them again from the start.
            undo()
            PLANNED.gave_up += 1
            self.middleware_manager = MiddlewareManager(Replay(self.outcomes))
            return super(FastLists, self).execute_operation(serially)

        try:
            data = run(self, charge)
        except Unfit:
            return again()
        if not self.is_awaitable(data):
            PLANNED.answered += 1
            return self.build_response(cast(dict[str, Any], data))

        async def finished() -> ExecutionResult | ExperimentalIncrementalExecutionResults:
            try:
                done = await cast(Awaitable[dict[str, Any]], data)
            except Unfit:
                result = again()
                if self.is_awaitable(result):
                    return await cast(Awaitable[ExecutionResult], result)
                return cast(ExecutionResult, result)
            PLANNED.answered += 1
            return self.build_response(done)

        return finished()

    def _answers_from_event_alone(self) -> bool:
        """Whether this subscription's answer to an event depends on the
        event alone: below the subscription field every field selected is a
        plain attribute (what this class's plans require: no resolver, no
        arguments, no list), and nothing wraps the resolvers. Not the
        context, then, which differs between listeners."""
        manager = self.middleware_manager
        if (manager is not None and manager.middlewares) or self.hooks is not None:
            return False
        if self.abort_signal is not None:
            return False
        root_type = self.schema.subscription_type
        if root_type is None:
            return False
        grouped, defers, _ = collect_fields(
            self.schema,
            self.fragments,
            self.variable_values,
            root_type,
            self.operation,
            self.hide_suggestions,
        )
        if defers:
            return False
        for details in grouped.values():
            name = details[0].node.name.value
            if name == "__typename":
                continue
            field = root_type.fields.get(name)
            if field is None or field.subscribe is None:
                return False
            field_type = field.type
            inner = field_type.of_type if isinstance(field_type, GraphQLNonNull) else field_type
            try:
                self._object_plan(inner, details)
            except Unfit:
                return False
        return True

    def complete_object_value(
        self,
        return_type: GraphQLObjectType,
        field_details_list: FieldDetailsList,
        info: GraphQLResolveInfo[Any],
        path: Path,
        result: Any,
        position_context: Any,
    ) -> AwaitableOrValue[dict[str, Any]]:
        # An object whose whole selection is plain, reached on graphql-core's
        # path (a mutation's answer, a subscription's event, a query its plan
        # left to graphql-core): built by its compiled plan, or, where that
        # gives up, by graphql-core from the same value.
        build = self._kept(
            "object",
            return_type,
            field_details_list,
            lambda: self._compiled(return_type, field_details_list),
        )
        if build is not None:
            charge, undo = self._charging()
            try:
                return build(result, charge)
            except Unfit:
                undo()  # graphql-core's path charges the large fields again
        return super().complete_object_value(
            return_type, field_details_list, info, path, result, position_context
        )

    def complete_iterable_value(
        self,
        item_type: GraphQLOutputType,
        field_details_list: FieldDetailsList,
        info: GraphQLResolveInfo[Any],
        path: Path,
        items: Iterable[Any],
        position_context: Any,
    ) -> Any:
        if isinstance(items, list):
            plan = self._kept(
                "list",
                item_type,
                field_details_list,
                lambda: self._item_plan(item_type, field_details_list),
            )
            if plan is not None:
                charge, undo = self._charging()
                try:
                    return [plan(item, charge) for item in items]
                except Unfit:
                    undo()  # graphql-core's path charges the large fields again
        return super().complete_iterable_value(
            item_type, field_details_list, info, path, items, position_context
        )

    def _kept(
        self,
        kind: str,
        of: GraphQLOutputType,
        details: FieldDetailsList,
        make: Callable[[], Build | None],
    ) -> Build | None:
        """The plan for a list's items or an object (``kind``) of type ``of``
        selected by ``details``, made once per operation: the same field of
        every item of an outer list shares its field_details_list, so one
        plan serves them all (graphql-core memoizes the same way)."""
        key = (kind, id(of), id(details))
        cached = self._plans.get(key)
        if cached is None:
            plan = make()
            cached = self._plans[key] = (details, _NO_PLAN if plan is None else plan)
        return None if cached[1] is _NO_PLAN else cast(Build, cached[1])

    def _item_plan(self, item_type: GraphQLOutputType, details: FieldDetailsList) -> Build | None:
        # A directive on the list field itself may be @stream: graphql-core's.
        if not isinstance(item_type, GraphQLNonNull) or any(d.node.directives for d in details):
            return None
        return self._compiled(item_type.of_type, details)

    def _compiled(self, return_type: GraphQLOutputType, details: FieldDetailsList) -> Build | None:
        """The plan for ``return_type`` selected by ``details``, or None: kept
        across operations unless a directive beneath makes it the variables'."""
        held = (self.schema, return_type, *(d.node for d in details))
        # Only what could be kept is ever found: the walk for directives
        # is made once per selection, not per operation.
        found, plan = PLANS.get(held)
        if found:
            return cast(Build | None, plan)
        cacheable = not any(self._directed(d.node.selection_set) for d in details)
        built: Build | None
        try:
            built = compile_shape(self._object_plan(return_type, details))
        except Unfit:
            built = None
        if cacheable:
            PLANS.keep(held, built)
        return built

    def _directed(
        self, selections: SelectionSetNode | None, seen: frozenset[str] = frozenset()
    ) -> bool:
        """Whether a directive appears anywhere in ``selections`` (fragments
        followed): what is selected may then depend on the variables."""
        if selections is None:
            return False
        for node in selections.selections:
            if node.directives:
                return True
            if isinstance(node, FragmentSpreadNode):
                name = node.name.value
                fragment = self.fragment_definitions.get(name)
                if name in seen or fragment is None:
                    return True  # not for this path to decide
                if fragment.directives or self._directed(fragment.selection_set, seen | {name}):
                    return True
            elif isinstance(node, FieldNode | InlineFragmentNode):
                if self._directed(node.selection_set, seen):
                    return True
        return False

    def _object_plan(self, return_type: GraphQLOutputType, details: FieldDetailsList) -> Shape:
        if not is_object_type(return_type):
            raise Unfit
        assert isinstance(return_type, GraphQLObjectType)
        grouped, defers, _ = self.collect_subfields(return_type, details)
        if defers:
            raise Unfit
        fields = [self._field_plan(return_type, key, d) for key, d in grouped.items()]
        return Shape(return_type.name, return_type.is_type_of, fields)

    def _field_plan(self, parent: GraphQLObjectType, key: str, details: FieldDetailsList) -> Field:
        node = details[0].node
        name = node.name.value
        if name == "__typename":
            return Field(key, typename=parent.name)
        field = parent.fields.get(name)
        if field is None or node.arguments or field.args:
            raise Unfit
        definition = field.extensions.get(GraphQLCoreConverter.DEFINITION_BACKREF)
        if definition is None or definition.base_resolver is not None:
            raise Unfit
        counted = False
        for extension in definition.extensions:
            if not isinstance(extension, CountsTowardResponse):
                raise Unfit
            counted = True
        field_type = field.type
        non_null = isinstance(field_type, GraphQLNonNull)
        inner = field_type.of_type if isinstance(field_type, GraphQLNonNull) else field_type
        attribute = definition.python_name
        if is_leaf_type(inner):
            assert isinstance(inner, GraphQLLeafType)
            return Field(
                key,
                attribute=attribute,
                coerce=inner.coerce_output_value,
                non_null=non_null,
                counted=counted,
            )
        if counted:
            raise Unfit
        sub = self._object_plan(inner, details)
        return Field(key, attribute=attribute, sub=sub, non_null=non_null)

    def _charging(self) -> tuple[Callable[[Any], None], Callable[[], None]]:
        """The charge of this operation's response budget for a plan's large
        fields, and what puts the budget back as it is now, for graphql-core
        to charge them again where the plan gives up."""
        spending = self._budget()
        if spending is None:
            return no_charge, _nothing
        spent, exceeded = spending.spent, spending.exceeded

        def undo() -> None:
            spending.spent, spending.exceeded = spent, exceeded

        return spending.charge, undo

    def _budget(self) -> Budget | None:
        """The operation's response budget (keyturn.schema.budget); None for
        a subscription's events."""
        if self.operation.operation is OperationType.SUBSCRIPTION:
            return None
        return current_budget()
