"""Every input type of the schema is built by its plan (keyturn.schema.conversion)
exactly as Strawberry's own conversion builds it: every field given, the
optional ones left out, the optional ones given as null."""

from __future__ import annotations

import itertools
from enum import Enum
from typing import Any

import pytest
from strawberry.types.arguments import convert_argument
from strawberry.types.base import (
    StrawberryObjectDefinition,
    StrawberryOptional,
    get_object_definition,
)
from strawberry.types.enum import StrawberryEnumDefinition

from keyturn.schema import schema


def _inputs() -> list[type]:
    found: list[type] = []
    for concrete in schema.schema_converter.type_map.values():
        definition = concrete.definition
        if isinstance(definition, StrawberryObjectDefinition) and definition.is_input:
            found.append(definition.origin)
    return sorted(found, key=lambda t: t.__name__)


INPUTS = _inputs()


def _sample(kind: Any, n: int) -> Any:
    while isinstance(kind, StrawberryOptional):
        kind = kind.of_type
    if isinstance(kind, StrawberryEnumDefinition):
        kind = kind.wrapped_cls
    if isinstance(kind, type) and issubclass(kind, Enum):
        members = list(kind)
        return members[n % len(members)]
    if kind is bool:
        return n % 2 == 0
    if kind is int:
        return n
    return f"value-{n}"


def _values(cls: type) -> list[dict[str, Any]]:
    """The input values a client could send, keyed by GraphQL name."""
    definition = get_object_definition(cls, strict=True)
    name = schema.config.name_converter.from_field
    fields = [(name(f), f.resolve_type(type_definition=definition)) for f in definition.fields]
    optional = [n for n, kind in fields if isinstance(kind, StrawberryOptional)]
    every = {n: _sample(kind, i) for i, (n, kind) in enumerate(fields)}
    out = [every, {n: v for n, v in every.items() if n not in optional}]
    out.append({**every, **dict.fromkeys(optional)})
    for left_out in itertools.chain.from_iterable(
        itertools.combinations(optional, r) for r in range(1, len(optional))
    ):
        out.append({n: v for n, v in every.items() if n not in left_out})
    return out


def test_every_input_type_has_a_plan() -> None:
    assert {t.__name__ for t in INPUTS} >= {"SubmitTurnInput", "CreateSessionInput"}
    for cls in INPUTS:
        assert get_object_definition(cls, strict=True).from_input is not None, cls


@pytest.mark.parametrize("cls", INPUTS, ids=lambda t: t.__name__)
def test_an_input_is_built_as_strawberry_builds_it(cls: type) -> None:
    definition = get_object_definition(cls, strict=True)
    registry = schema.schema_converter.scalar_registry
    for value in _values(cls):
        planned = convert_argument(value, cls, registry, schema.config)
        plan, definition.from_input = definition.from_input, None
        try:
            general = convert_argument(value, cls, registry, schema.config)
        finally:
            definition.from_input = plan
        assert type(planned) is type(general) is cls
        assert vars(planned) == vars(general), value
