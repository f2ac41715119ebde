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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

from graphql import (
    GraphQLLeafType,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLResolveInfo,
    OperationType,
    is_leaf_type,
    is_object_type,
)
from graphql.execution.collect_fields import FieldDetailsList
from graphql.pyutils import Path, Undefined
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.schema.schema_converter import GraphQLCoreConverter

from keyturn.schema.budget import Budget, CountsTowardResponse
from keyturn.schema.budget import running as current_budget

Build = Callable[[Any], dict[str, Any]]


class _Unfit(Exception):
    """This list is not one the fast path completes exactly as graphql-core would."""


_NO_PLAN = object()


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
