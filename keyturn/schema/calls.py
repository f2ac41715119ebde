"""A field's resolver called as Strawberry's wrapper calls it, without the wrapper.

Strawberry resolves a field through layers made for every feature it has:
an async wrapper, an extension runner (a ``reduce`` of partials, even when
the field has no extension), the arguments converted the general way (each
argument's GraphQL name from the name converter, its type tested against
every kind an argument can have), then the resolver. For a field that uses
none of those features, all of it ends in one call: the resolver, given the
object (as ``self``, ``root`` or ``parent``, as it asks), its Info and its
arguments under their Python names, each as graphql-core coerced it or, for
an input type, built by that type's own ``from_input``
(keyturn.schema.conversion). :func:`direct_call` makes that call, worked out
once per field; a compiled plan (keyturn.schema.operations) uses it in place
of the wrapper (a page of one event took 0.88 of the CPU it took through
the wrapper, in one process, the two in turn).

It is made only where it is the same call: the field has a resolver, no
field extension (a large field's charge is one) and no exception handler of
the schema's, and every argument is a leaf (a scalar but GlobalID, which
Strawberry decodes, or an enum), an input type with its own ``from_input``,
or either of them optional; anything else (a list, a ``Maybe``, a lazy type)
keeps Strawberry's wrapper. The plan gives its outcome to graphql-core
exactly as it would the wrapper's: the same value, or the same exception
(raised at the call, where the wrapper's coroutine raised it when awaited:
graphql-core reports both at the field). tests/integration/
test_fast_lists_differential.py checks that a resolver receives the same
arguments both ways.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphql import GraphQLField
from strawberry.relay import GlobalID
from strawberry.scalars import is_scalar
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.types.arguments import InputContext
from strawberry.types.base import (
    StrawberryMaybe,
    StrawberryOptional,
    StrawberryType,
    get_object_definition,
)
from strawberry.types.enum import StrawberryEnumDefinition, has_enum_definition
from strawberry.types.field import StrawberryField
from strawberry.types.fields.resolver import StrawberryResolver

# An argument: its GraphQL name, its Python name, and how its value is built
# (None: as graphql-core coerced it).
_Build = Callable[[Any, Any, str], Any]
_Argument = tuple[str, str, _Build | None]


def _unwrapped(type_: object) -> object | None:
    """The type inside any optional; None where it is a ``Maybe`` (whose value
    Strawberry wraps in ``Some``)."""
    while isinstance(type_, StrawberryOptional):
        if isinstance(type_, StrawberryMaybe):
            return None
        type_ = type_.of_type
    return type_


def _argument_build(type_: object, strawberry_schema: Any) -> tuple[bool, _Build | None]:
    """Whether an argument of ``type_`` can be built here, and how (None: the
    value as it is)."""
    inner = _unwrapped(type_)
    if inner is None or inner is GlobalID:
        return False, None
    registry = strawberry_schema.schema_converter.scalar_registry
    if (
        is_scalar(inner, registry)
        or isinstance(inner, StrawberryEnumDefinition)
        or has_enum_definition(inner)
    ):
        return True, None
    definition = get_object_definition(inner)
    if definition is None or not definition.is_input or definition.from_input is None:
        return False, None
    from_input, input_type = definition.from_input, definition.origin
    config = strawberry_schema.config

    def build(value: Any, info: Any, name: str) -> Any:
        context = InputContext(info=info, config=config, scalar_registry=registry, path=(name,))
        return from_input(input_type, value, context)

    return True, build


def direct_call(strawberry_schema: Any, field: GraphQLField) -> Callable[..., Any] | None:
    """``field``'s resolver, called with what Strawberry's wrapper would give
    it, from the object, graphql-core's resolve info and its arguments; None
    where the wrapper does more than that."""
    definition = field.extensions.get(GraphQLCoreConverter.DEFINITION_BACKREF)
    if not isinstance(definition, StrawberryField):
        return None
    resolver = definition.base_resolver
    if resolver is None or definition.extensions or definition.is_subscription:
        return None
    # A field or resolver class of its own may call differently.
    if type(definition).get_result is not StrawberryField.get_result:
        return None
    if type(resolver).__call__ is not StrawberryResolver.__call__:
        return None
    converter = strawberry_schema.schema_converter
    if converter._get_field_exception_handlers(definition):
        return None
    arguments: list[_Argument] = []
    name_of = strawberry_schema.config.name_converter.from_argument
    for argument in definition.arguments:
        assert argument.python_name
        kind: StrawberryType | type | object = argument.type
        fits, build = _argument_build(kind, strawberry_schema)
        if not fits:
            return None
        arguments.append((name_of(argument), argument.python_name, build))
    func = resolver.wrapped_func
    if not callable(func):
        return None
    as_self = resolver.self_parameter is not None
    as_named = [
        p.name for p in (resolver.parent_parameter, resolver.root_parameter) if p is not None
    ]
    info_name = resolver.info_parameter.name if resolver.info_parameter is not None else None
    info_class = strawberry_schema.config.info_class

    def call(source: Any, info: Any, **given: Any) -> Any:
        strawberry_info = info_class(_raw_info=info, _field=definition)
        kwargs: dict[str, Any] = {}
        for graphql_name, python_name, build in arguments:
            if graphql_name in given:
                value = given[graphql_name]
                kwargs[python_name] = (
                    value
                    if build is None or value is None
                    else build(value, strawberry_info, graphql_name)
                )
        for name in as_named:
            kwargs[name] = source
        if info_name is not None:
            kwargs[info_name] = strawberry_info
        return func(source, **kwargs) if as_self else func(**kwargs)

    return call


__all__ = ["direct_call"]
