"""What a query may cost, decided before it runs.

The cost estimates how many values a query can make the server read and
write, the way GitHub's API bounds the nodes of a request: every field costs
1 (``input``, ``output`` and the JSON fields cost :data:`LARGE_WEIGHT`, since
one of them can be many kilobytes), and a list multiplies what it selects:

* a connection by its page size, ``first`` or ``last``, or the field's
  default page size when neither is given;
* ``Turn.events`` by its ``first``, or without it by the most it answers
  unpaged (:data:`PAGED_LISTS`: the resolver refuses a turn with more);
* ``Turn.toolCalls`` (a plain list, not paged) by a fixed estimate of its
  length (:data:`LIST_ESTIMATE`);
* ``nodes(ids:)`` by the number of ids.

A value given by a variable (``first: $n``) is not known when a document is
validated (validation is cached per document), so it counts as the most it
may be, :data:`MAX_PAGE`. Fragments count wherever they are spread, inline
fragments on a union or interface add up (an upper bound). Introspection
fields cost nothing here: graphql-core's own rule bounds them.
"""

from __future__ import annotations

import functools
from typing import Any

from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLInterfaceType,
    GraphQLList,
    GraphQLNamedType,
    GraphQLObjectType,
    InlineFragmentNode,
    IntValueNode,
    ListValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    ValidationContext,
    ValidationRule,
    VariableNode,
    get_named_type,
    get_nullable_type,
)

from keyturn.resolvers.pagination import MAX_FIRST, MAX_UNPAGED_TURN_EVENTS

MAX_PAGE = MAX_FIRST
LARGE_WEIGHT = 10
LARGE_FIELDS = frozenset(
    {("Turn", "input"), ("Turn", "output"), ("Event", "data")}
    | {("ToolCall", "arguments"), ("ToolCall", "result")}
    | {("PendingApprovalCall", "arguments")}
)
# The page a connection field returns when it is given no first or last.
DEFAULT_PAGE = {
    ("Query", "sessions"): 20,
    ("Query", "pendingApprovals"): 20,
    ("Session", "turns"): 20,
    ("Session", "events"): 100,
}
# Lists paged by ``first``: without it, the most the resolver answers.
PAGED_LISTS = {("Turn", "events"): MAX_UNPAGED_TURN_EVENTS}
# Plain lists: how long they are taken to be.
LIST_ESTIMATE = {("Turn", "toolCalls"): 10}

CODE = "QUERY_TOO_COSTLY"


def _int_argument(node: FieldNode, names: tuple[str, ...]) -> int | None:
    """The first of ``names`` given, as a count (a variable: the most it may be)."""
    for argument in node.arguments or ():
        if argument.name.value not in names:
            continue
        value = argument.value
        if isinstance(value, VariableNode):
            return MAX_PAGE
        if isinstance(value, IntValueNode):
            return max(int(value.value), 0)
        return 0  # null or a wrong type: other rules, or the resolver, answer it
    return None


def _list_length(node: FieldNode) -> int:
    for argument in node.arguments or ():
        if isinstance(argument.value, ListValueNode):
            return len(argument.value.values)
    return MAX_PAGE  # a variable, or a single value a list input coerces


class _Coster:
    def __init__(self, context: ValidationContext) -> None:
        self.schema = context.schema
        self.fragments: dict[str, FragmentDefinitionNode] = {
            d.name.value: d
            for d in context.document.definitions
            if isinstance(d, FragmentDefinitionNode)
        }

    def selection_set(
        self,
        selections: SelectionSetNode | None,
        parent: GraphQLNamedType | None,
        page: int,
        spreading: frozenset[str],
    ) -> int:
        if selections is None or not isinstance(parent, GraphQLObjectType | GraphQLInterfaceType):
            return 0
        total = 0
        for selection in selections.selections:
            if isinstance(selection, FieldNode):
                total += self.field(selection, parent, page, spreading)
            elif isinstance(selection, InlineFragmentNode):
                on = (
                    self.schema.get_type(selection.type_condition.name.value)
                    if selection.type_condition
                    else parent
                )
                total += self.selection_set(selection.selection_set, on, page, spreading)
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                fragment = self.fragments.get(name)
                if fragment is None or name in spreading:
                    continue  # unknown or cyclic: other rules report it
                on = self.schema.get_type(fragment.type_condition.name.value)
                total += self.selection_set(fragment.selection_set, on, page, spreading | {name})
        return total

    def field(
        self,
        node: FieldNode,
        parent: GraphQLObjectType | GraphQLInterfaceType,
        page: int,
        spreading: frozenset[str],
    ) -> int:
        name = node.name.value
        if name.startswith("__"):
            return 0
        definition = parent.fields.get(name)
        if definition is None:
            return 0  # other rules report an unknown field
        key = (parent.name, name)
        weight = LARGE_WEIGHT if key in LARGE_FIELDS else 1
        named = get_named_type(definition.type)
        if named.name.endswith("Connection"):
            size = _int_argument(node, ("first", "last"))
            inner = DEFAULT_PAGE.get(key, MAX_PAGE) if size is None else size
            return weight + self.selection_set(node.selection_set, named, inner, spreading)
        times = 1
        if isinstance(get_nullable_type(definition.type), GraphQLList):
            if parent.name.endswith("Connection") and name == "edges":
                times = page
            elif key == ("Query", "nodes"):
                times = _list_length(node)
            elif key in PAGED_LISTS:
                size = _int_argument(node, ("first",))
                times = PAGED_LISTS[key] if size is None else size
            else:
                times = LIST_ESTIMATE.get(key, MAX_PAGE)
        return times * (weight + self.selection_set(node.selection_set, named, 1, spreading))

    def operation(self, operation: OperationDefinitionNode) -> int:
        root = self.schema.get_root_type(operation.operation)
        return self.selection_set(operation.selection_set, root, 1, frozenset())


def query_cost(context: ValidationContext, operation: OperationDefinitionNode) -> int:
    return _Coster(context).operation(operation)


def too_costly(cost: int, limit: int) -> GraphQLError:
    return GraphQLError(
        f"this query would cost {cost}, over the limit of {limit}: ask for smaller pages "
        "(first/last) or fewer nested lists",
        extensions={"code": CODE, "cost": cost, "limit": limit},
    )


@functools.cache
def cost_rule(limit: int) -> type[ValidationRule]:
    """The rule for ``limit``, one class per limit: ValidationCache keys its
    entries by the rule classes, so a class made per request would never hit."""

    class QueryCostRule(ValidationRule):
        def enter_operation_definition(self, node: OperationDefinitionNode, *_: Any) -> Any:
            cost = query_cost(self.context, node)
            if cost > limit:
                self.report_error(too_costly(cost, limit))
            return self.SKIP

    return QueryCostRule
