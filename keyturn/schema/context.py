"""The context every resolver is given, and what a resolver asks of its field."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import strawberry
from graphql import FieldNode, GraphQLError, GraphQLObjectType, get_named_type
from graphql.execution.values import VariableValues, get_argument_values
from strawberry.types.nodes import SelectedField

from keyturn.resolvers.context import Context

Info = strawberry.Info[Context, None]

__all__ = ["Context", "Info", "child_arguments", "child_selects_only", "selects"]


def selects(info: Info, name: str) -> bool:
    """Whether the document selects ``name`` on this field's value, directly
    or through fragments: a count nobody asked for is not worth a query."""

    def among(selections: Iterable[Any]) -> bool:
        for selection in selections:
            if isinstance(selection, SelectedField):
                if selection.name == name:
                    return True
            elif among(selection.selections):  # a fragment, spread or inline
                return True
        return False

    return any(among(field.selections) for field in info.selected_fields)


def _child_node(info: Info, name: str) -> FieldNode | None:
    # The field ``name`` selected exactly once on this field's value,
    # directly (not in a fragment) and with no directive.
    raw = info._raw_info
    if len(raw.field_nodes) != 1 or raw.field_nodes[0].selection_set is None:
        return None
    found: FieldNode | None = None
    for selection in raw.field_nodes[0].selection_set.selections:
        if isinstance(selection, FieldNode) and selection.name.value == name:
            if found is not None or selection.directives:
                return None
            found = selection
    return found


def child_selects_only(
    info: Info, name: str, path: tuple[str, ...], allowed: frozenset[str]
) -> bool:
    """Whether the field ``name`` of this field's value (as
    :func:`child_arguments` finds it) selects, at ``path`` below it (say
    ``edges``, ``node``), nothing but fields named in ``allowed``. False
    where it is not known: any fragment on the way or there, or beside the
    field (a fragment on this field's value may select ``name`` again, and
    graphql-core merges the two selections into one field)."""
    found = _child_node(info, name)
    if found is None or found.selection_set is None:
        return False
    beside = info._raw_info.field_nodes[0].selection_set
    if beside is None or not all(isinstance(s, FieldNode) for s in beside.selections):
        return False

    def only(selections: Iterable[Any], rest: tuple[str, ...]) -> bool:
        for selection in selections:
            if not isinstance(selection, FieldNode):
                return False  # a spread or inline fragment
            field = selection.name.value
            if not rest:
                if field not in allowed:
                    return False
            elif field == rest[0]:
                if selection.selection_set is None:
                    return False
                if not only(selection.selection_set.selections, rest[1:]):
                    return False
        return True

    return only(found.selection_set.selections, path)


def child_arguments(info: Info, name: str) -> dict[str, Any] | None:
    """The arguments the field ``name`` of this field's value will be given,
    for a resolver that can read what that field needs along with its own
    value: when the document selects ``name`` exactly once, directly (not
    in a fragment) and with no directive. None otherwise, or when it is not
    known yet (the field may then read on its own, as it always can)."""
    raw = info._raw_info
    found = _child_node(info, name)
    owner = get_named_type(raw.return_type)
    if found is None or not isinstance(owner, GraphQLObjectType):
        return None
    try:
        # Strawberry's executor gives the info the coerced values alone (a
        # dict, where graphql-core's type says VariableValues): all that
        # coercing an argument reads of them.
        given: Any = raw.variable_values
        coerced = given.coerced if isinstance(given, VariableValues) else given
        variables = VariableValues(sources={}, coerced=coerced)
        return get_argument_values(owner.fields[name], found, variables)
    except (GraphQLError, KeyError):
        return None
