"""What graphql-core works out anew for every operation before it runs one,
worked out once per document: which operation a name picks, the document's
fragments, and each variable's signature (its name, type and default).

graphql-core's ``Executor.build`` walks the document's definitions, resolves
every variable's type from its AST and checks each value's nesting depth on
every request; for a replayed ``submitTurn`` that was a twentieth of the
request's CPU. :func:`prepare` does the walk and the type lookups once, and
:meth:`Prepared.variables` coerces the request's values as graphql-core's
``coerce_input_value`` does, by a coercer made once per variable
(:func:`coercer`). It answers only where every value coerces:
anything else (a missing or invalid value, a default that does not coerce, a
fragment with variables of its own) is None, and graphql-core's ``build``
then runs as before and gives its errors, with their exact messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphql import (
    DocumentNode,
    FragmentDefinitionNode,
    GraphQLError,
    GraphQLInputObjectType,
    GraphQLInputType,
    GraphQLList,
    GraphQLNonNull,
    GraphQLSchema,
    OperationDefinitionNode,
    Undefined,
    VariableDefinitionNode,
    is_input_object_type,
    is_list_type,
    is_non_null_type,
    is_required_input_field,
)
from graphql.execution.collect_fields import FragmentDetails
from graphql.execution.get_variable_signature import (
    GraphQLVariableSignature,
    get_variable_signature,
)
from graphql.execution.values import VariableValues, VariableValueSource
from graphql.pyutils import is_iterable
from graphql.type import GraphQLDefaultInput, assert_leaf_type
from graphql.utilities import coerce_input_value
from graphql.utilities.coerce_input_value import coerce_default_value


def _nests(type_: GraphQLInputType, within: frozenset[str] = frozenset()) -> bool:
    """Whether a value of ``type_`` may nest without bound: an input object
    that holds itself (through any chain of fields). Only then can a value
    be too deep to coerce, the case graphql-core checks each value for."""
    while is_non_null_type(type_) or is_list_type(type_):
        type_ = type_.of_type
    if not is_input_object_type(type_):
        return False
    if type_.name in within:
        return True
    inside = within | {type_.name}
    return any(_nests(field.type, inside) for field in type_.fields.values())


# A value of one input type, coerced; Undefined where it does not coerce.
Coerce = Callable[[Any], Any]


def coercer(type_: GraphQLInputType) -> Coerce:
    """graphql-core's ``coerce_input_value(value, type_)`` with the type's
    dispatch decided once: which wrapper, which fields, which leaf. graphql-core
    asks it again at every level of every value (for a ``submitTurn`` input,
    eight calls and some forty type tests a request). The same tests on the
    value, in the same order, with the same results, Undefined included. A
    type that nests (:func:`_nests`, which :func:`prepare` leaves to
    graphql-core's ``build``) has no end to unfold: graphql-core's own
    function coerces it."""
    if _nests(type_):
        return lambda value: coerce_input_value(value, type_)
    if isinstance(type_, GraphQLNonNull):
        inner = coercer(type_.of_type)

        def non_null(value: Any) -> Any:
            if value is None or value is Undefined:
                return Undefined
            return inner(value)

        return non_null
    if isinstance(type_, GraphQLList):
        item = coercer(type_.of_type)

        def listed(value: Any) -> Any:
            if value is None or value is Undefined:
                return None
            if not is_iterable(value):
                # A value that is not a list is a list of one.
                one = item(value)
                return Undefined if one is Undefined else [one]
            items = []
            for value_item in value:
                one = item(value_item)
                if one is Undefined:
                    return Undefined
                items.append(one)
            return items

        return listed
    if isinstance(type_, GraphQLInputObjectType):
        return _object_coercer(type_)
    leaf = assert_leaf_type(type_)
    parse = leaf.coerce_input_value

    def leaf_value(value: Any) -> Any:
        if value is None or value is Undefined:
            return None
        try:
            return parse(value)
        except Exception:  # graphql-core's: any failure is no value
            return Undefined

    return leaf_value


def _object_coercer(type_: GraphQLInputObjectType) -> Coerce:
    fields = type_.fields
    # (name, the key it is coerced to, required, the field, its coercer)
    plan = [
        (name, field.out_name or name, is_required_input_field(field), field, coercer(field.type))
        for name, field in fields.items()
    ]
    one_of, out_type = type_.is_one_of, type_.out_type

    def input_object(value: Any) -> Any:
        if value is None or value is Undefined:
            return None
        if not isinstance(value, dict):
            return Undefined
        defined = 0
        for name, field_value in value.items():
            if field_value is Undefined:
                continue
            defined += 1
            if name not in fields:
                return Undefined
        coerced: dict[str, Any] = {}
        for name, key, required, field, coerce in plan:
            field_value = value.get(name, Undefined)
            if field_value is Undefined:
                if required:
                    return Undefined
                # Per call, as graphql-core does: it memoizes the default on
                # the field, and raises for one that does not coerce.
                default = coerce_default_value(field)
                if default is not Undefined:
                    coerced[key] = default
                continue
            found = coerce(field_value)
            if found is Undefined:
                return Undefined
            coerced[key] = found
        if one_of:
            keys = list(coerced)
            if defined != 1 or len(keys) != 1 or coerced[keys[0]] is None:
                return Undefined
        return out_type(coerced)

    return input_object


@dataclass(frozen=True, slots=True)
class _Variable:
    name: str
    signature: GraphQLVariableSignature
    node: VariableDefinitionNode
    required: bool  # non-null with no default: a value must be given
    coerce: Coerce


@dataclass(frozen=True, slots=True)
class Prepared:
    operation: OperationDefinitionNode
    fragment_definitions: dict[str, FragmentDefinitionNode]
    fragments: dict[str, FragmentDetails]
    _variables: tuple[_Variable, ...]

    def variables(self, inputs: dict[str, Any]) -> VariableValues | None:
        """The operation's variables coerced from ``inputs`` as graphql-core's
        ``get_variable_values`` coerces them; None where that would report
        an error."""
        sources: dict[str, VariableValueSource] = {}
        coerced: dict[str, Any] = {}
        for variable in self._variables:
            name = variable.name
            value = inputs.get(name, Undefined)
            if value is Undefined:
                sources[name] = VariableValueSource(variable.signature)
                if variable.node.default_value:
                    # A signature of its own, as graphql-core makes one per
                    # operation: the coerced default is memoized on it, and
                    # a value kept across requests could be changed by one.
                    fresh = GraphQLVariableSignature(
                        name,
                        variable.signature.type,
                        GraphQLDefaultInput(literal=variable.node.default_value),
                    )
                    try:
                        default = coerce_default_value(fresh)
                    except TypeError:
                        return None
                    if default is not Undefined:
                        coerced[name] = default
                    continue
                if variable.required:
                    return None
                continue
            sources[name] = VariableValueSource(variable.signature, value)
            found = variable.coerce(value)
            if found is Undefined:
                return None
            coerced[name] = found
        return VariableValues(sources, coerced)


def prepare(
    schema: GraphQLSchema, document: DocumentNode, operation_name: str | None
) -> Prepared | None:
    """``document``'s operation named ``operation_name`` (or its only one),
    its fragments and its variables' signatures, as ``Executor.build`` finds
    them; None where ``build`` would answer an error, or would check more
    than these do (a fragment's own variables, a type that nests)."""
    operation: OperationDefinitionNode | None = None
    fragment_definitions: dict[str, FragmentDefinitionNode] = {}
    fragments: dict[str, FragmentDetails] = {}
    for definition in document.definitions:
        if isinstance(definition, OperationDefinitionNode):
            if operation_name is None:
                if operation is not None:
                    return None  # more than one operation, and no name
                operation = definition
            elif definition.name and definition.name.value == operation_name:
                operation = definition
        elif isinstance(definition, FragmentDefinitionNode):
            if definition.variable_definitions:
                return None
            fragment_definitions[definition.name.value] = definition
            fragments[definition.name.value] = FragmentDetails(definition, None)
    if operation is None:
        return None
    variables = []
    for node in operation.variable_definitions or ():
        signature = get_variable_signature(schema, node)
        if isinstance(signature, GraphQLError) or _nests(signature.type):
            return None
        variables.append(
            _Variable(
                signature.name,
                signature,
                node,
                required=is_non_null_type(signature.type) and not node.default_value,
                coerce=coercer(signature.type),
            )
        )
    return Prepared(operation, fragment_definitions, fragments, tuple(variables))


__all__ = ["Prepared", "prepare"]
