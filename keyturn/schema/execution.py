"""Lists of plain objects completed in one pass, not field by field.

graphql-core completes every field of every item of a list on its own: a
page of 100 events selecting ``cursor node { seq type data }`` is some 500
resolver calls, resolve infos and completions, most of a page request's time.
When every field the document selects on a list's items is a plain attribute
(no resolver, no arguments; a leaf, ``__typename``, or a plain object of the
same kind), :class:`FastLists` builds each item's answer straight from its
attributes, once the selection has been collected for the whole list. Only
what the document selects is read.

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
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from graphql import (
    ExecutionResult,
    ExperimentalIncrementalExecutionResults,
    GraphQLLeafType,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLResolveInfo,
    OperationType,
    is_leaf_type,
    is_object_type,
)
from graphql.execution.collect_fields import FieldDetailsList, collect_fields
from graphql.language import OperationDefinitionNode
from graphql.pyutils import AwaitableOrValue, Path, Undefined
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.schema.schema_converter import GraphQLCoreConverter

from keyturn.schema.budget import Budget, CountsTowardResponse
from keyturn.schema.budget import running as current_budget

Build = Callable[[Any], dict[str, Any]]


class _Unfit(Exception):
    """This list is not one the fast path completes exactly as graphql-core would."""


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


def _frozen(value: Any) -> Hashable:
    """A hashable form of coerced variable values; TypeError when one is not.
    Types are kept: 1, 1.0 and True are equal, but not the same answer."""
    if isinstance(value, dict):
        return (dict, tuple(sorted((k, _frozen(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        return (list, tuple(_frozen(v) for v in value))
    hash(value)
    return (type(value), value)


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
        self._plans: dict[tuple[int, int], tuple[FieldDetailsList, Any]] = {}

    def execute_operation(
        self, serially: bool | None = None
    ) -> AwaitableOrValue[ExecutionResult | ExperimentalIncrementalExecutionResults]:
        if self.operation.operation is not OperationType.SUBSCRIPTION:
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
            except _Unfit:
                return False
        return True

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
            plan = self._plan_for(item_type, field_details_list)
            if plan is not None:
                spending = self._budget()
                charged = spending.spent if spending is not None else 0
                try:
                    return [plan(item) for item in items]
                except _Unfit:
                    # graphql-core's path charges the large fields again.
                    if spending is not None:
                        spending.spent = charged
        return super().complete_iterable_value(
            item_type, field_details_list, info, path, items, position_context
        )

    def _plan_for(self, item_type: GraphQLOutputType, details: FieldDetailsList) -> Build | None:
        # The same list field of every item of an outer list shares its
        # field_details_list: one plan for all (graphql-core memoizes the same way).
        key = (id(item_type), id(details))
        cached = self._plans.get(key)
        if cached is not None:
            return None if cached[1] is _NO_PLAN else cached[1]
        # A directive on the list field itself may be @stream: graphql-core's.
        if not isinstance(item_type, GraphQLNonNull) or any(d.node.directives for d in details):
            plan: Any = None
        else:
            try:
                plan = self._object_plan(item_type.of_type, details)
            except _Unfit:
                plan = None
        self._plans[key] = (details, _NO_PLAN if plan is None else plan)
        return cast(Build | None, plan)

    def _object_plan(self, return_type: GraphQLOutputType, details: FieldDetailsList) -> Build:
        if not is_object_type(return_type):
            raise _Unfit
        assert isinstance(return_type, GraphQLObjectType)
        grouped, defers, _ = self.collect_subfields(return_type, details)
        if defers:
            raise _Unfit
        is_type_of = return_type.is_type_of
        steps: list[Callable[[Any, dict[str, Any]], None]] = []
        for key, field_details in grouped.items():
            steps.append(self._field_step(return_type, key, field_details))

        def build(source: Any) -> dict[str, Any]:
            # Strawberry's is_type_of looks only at the object, not the info.
            if is_type_of is not None and is_type_of(source, None) is not True:  # type: ignore[arg-type]
                raise _Unfit
            out: dict[str, Any] = {}
            for step in steps:
                step(source, out)
            return out

        return build

    def _field_step(
        self, parent: GraphQLObjectType, key: str, details: FieldDetailsList
    ) -> Callable[[Any, dict[str, Any]], None]:
        node = details[0].node
        name = node.name.value
        if name == "__typename":
            type_name = parent.name

            def typename(_source: Any, out: dict[str, Any]) -> None:
                out[key] = type_name

            return typename
        field = parent.fields.get(name)
        if field is None or node.arguments or field.args:
            raise _Unfit
        definition = field.extensions.get(GraphQLCoreConverter.DEFINITION_BACKREF)
        if definition is None or definition.base_resolver is not None:
            raise _Unfit
        counted = False
        for extension in definition.extensions:
            if not isinstance(extension, CountsTowardResponse):
                raise _Unfit
            counted = True
        attribute = definition.python_name
        field_type = field.type
        non_null = isinstance(field_type, GraphQLNonNull)
        inner = field_type.of_type if isinstance(field_type, GraphQLNonNull) else field_type
        if is_leaf_type(inner):
            assert isinstance(inner, GraphQLLeafType)
            coerce = inner.coerce_output_value
            charge = self._charger() if counted else None

            def leaf(source: Any, out: dict[str, Any]) -> None:
                # A value its scalar refuses (an Int past 32 bits), or an
                # attribute that raises, is an error at the item's field:
                # graphql-core's path reports it there, not at the list.
                try:
                    value = getattr(source, attribute)
                    coerced = None if value is None else coerce(value)
                except Exception:
                    raise _Unfit from None
                if value is None:
                    if non_null:
                        raise _Unfit
                    out[key] = None
                else:
                    if coerced is None or coerced is Undefined:
                        raise _Unfit
                    out[key] = coerced
                if charge is not None:
                    charge(value)

            return leaf
        if counted:
            raise _Unfit
        sub = self._object_plan(inner, details)

        def obj(source: Any, out: dict[str, Any]) -> None:
            try:
                value = getattr(source, attribute)
            except Exception:
                raise _Unfit from None
            if value is None:
                if non_null:
                    raise _Unfit
                out[key] = None
            else:
                out[key] = sub(value)

        return obj

    def _budget(self) -> Budget | None:
        """The operation's response budget (keyturn.schema.budget); None for
        a subscription's events."""
        if self.operation.operation is OperationType.SUBSCRIPTION:
            return None
        return current_budget()

    def _charger(self) -> Callable[[Any], None] | None:
        """What CountsTowardResponse does around a large field's value."""
        spending = self._budget()
        return spending.charge if spending is not None else None
