"""Input types built from their GraphQL value by a plan worked out once.

Strawberry converts a mutation's input object on every request the general
way: for each of its fields, the field's GraphQL name from the name
converter, its annotation resolved, the value's type tested against every
kind a field can have. For an input whose fields are all leaves (scalars
and enums, optional or not) that work always ends in
the value graphql-core gave (with the plan, a replayed submitTurn took 0.88
and 0.96 of the CPU it took without, in two runs of the two in turn).
:func:`converted_once` gives such a type Strawberry's own hook for building
an input (``from_input`` on its definition) with what each field needs
worked out on first use: a leaf's value as graphql-core coerced it, any
other field converted by Strawberry as before (``InputContext.convert``).

tests/unit/test_input_conversion.py checks that every input type of the
schema is built the same both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING
from typing import Any, TypeVar

from strawberry.relay import GlobalID
from strawberry.scalars import is_scalar
from strawberry.types.arguments import InputContext
from strawberry.types.base import StrawberryOptional, StrawberryType, get_object_definition
from strawberry.types.enum import StrawberryEnumDefinition, has_enum_definition

T = TypeVar("T", bound=type)

# (GraphQL name, Python name, the field's type or None for a leaf)
_Plan = list[tuple[str, str, StrawberryType | type | None]]


def _is_leaf(type_: object, context: InputContext) -> bool:
    """Whether Strawberry hands this field's value on as graphql-core gave
    it: a scalar of the schema's registry (but a GlobalID, which it
    decodes) or an enum, optional or not."""
    while isinstance(type_, StrawberryOptional):
        type_ = type_.of_type
    if type_ is GlobalID:
        return False
    return (
        is_scalar(type_, context.scalar_registry)
        or isinstance(type_, StrawberryEnumDefinition)
        or has_enum_definition(type_)
    )


def converted_once(cls: T) -> T:
    """``cls`` (a ``@strawberry.input``), built by a plan made on first use."""
    definition = get_object_definition(cls, strict=True)
    plan: _Plan | None = None
    # As Strawberry does: a field with no default of its own is None unless
    # given (graphql-core has checked that a required one is).
    implicit = {
        field.python_name: None
        for field in definition.fields
        if field.default_value is MISSING and field.default_factory is MISSING
    }

    def make_plan(context: InputContext) -> _Plan:
        return [
            (
                context.config.name_converter.from_field(field),
                field.python_name,
                None if _is_leaf(kind, context) else kind,
            )
            for field in definition.fields
            for kind in (field.resolve_type(type_definition=definition),)
        ]

    def from_input(type_: type, value: Mapping[str, Any], context: InputContext) -> Any:
        nonlocal plan
        if plan is None:
            plan = make_plan(context)
        kwargs: dict[str, Any] = dict(implicit)
        for graphql_name, python_name, kind in plan:
            if graphql_name in value:
                given = value[graphql_name]
                kwargs[python_name] = (
                    given
                    if kind is None or given is None
                    else context.convert(given, kind, graphql_name)
                )
        # A field the client left out takes the class's default, as it
        # would from Strawberry (graphql-core fills the published ones in).
        return type_(**kwargs)

    build: Callable[[type, Mapping[str, Any], InputContext], Any] = from_input
    definition.from_input = build
    return cls


__all__ = ["converted_once"]
