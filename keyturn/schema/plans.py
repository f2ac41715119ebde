"""An object's selection compiled to one Python function.

A list of plain objects (keyturn.schema.execution.FastLists) is completed by
a plan: the fields its document selects on each item, each a plain
attribute, a leaf or a plain object of the same kind. Walking a list of
steps per item, one closure call per field, was most of a page of 100
events (eleven Python calls per event); the plan is generated as the source
of one function per object type, with the attributes read and the answer
built as a dict literal in the document's order, so an event costs one call
for its edge and one for its node.

A plan answers exactly as graphql-core's completion would or not at all: a
null in a non-null field, a value its scalar refuses (or turns into null),
an attribute that raises, an object its type does not claim: each raises
:class:`Unfit`, and the list is completed by graphql-core, which gives the
error its path and message. Scalars are coerced by their own functions;
for String, ID, Int and Boolean, a value of exactly the type they return
unchanged is taken as it is without the call (the same answer, tested);
event data read as its JSON text (RawJSON) is answered as the orjson
fragment the answer's encoder would make of it, so the answer's bytes are
the same; an object's type is told by ``isinstance`` where Strawberry's
``is_type_of`` would say so (:func:`instance_of`).

A plan depends only on the schema and the selection (the document's field
nodes; fragments come from the same document), unless a directive such as
@include decides what is selected by the variables: such a plan is built
for its operation alone (``cacheable``), the others are kept across
operations by :class:`Plans`.
"""

from __future__ import annotations

import itertools
import keyword
from collections.abc import Callable
from typing import Any

import orjson
from graphql.pyutils import Undefined
from graphql.type import scalars
from strawberry.scalars import JSON
from strawberry.schema.types.scalar import DEFAULT_SCALAR_REGISTRY
from strawberry.types.cast import TYPE_CAST_ATTRIBUTE

from keyturn.db.reads import RawJSON

# A plan: the source object and the charge of the operation's response
# budget (keyturn.schema.budget) for the large fields.
Build = Callable[[Any, Callable[[Any], None]], dict[str, Any]]


class Unfit(Exception):
    """This object is not one a plan completes exactly as graphql-core would."""


def no_charge(_value: Any) -> None:
    """The charge where nothing is charged (a subscription's events)."""


# Scalars whose coercion returns a value of exactly this type unchanged.
_UNCHANGED: dict[Any, str] = {
    scalars.serialize_string: "str",
    scalars.serialize_id: "str",
    scalars.serialize_boolean: "bool",
    # Strawberry's JSON scalar answers every value as it is (``lambda v: v``):
    # event data read as its JSON text, or a decoded document.
    DEFAULT_SCALAR_REGISTRY[JSON].serialize: "_JSON_AS_IS",
}
# What the JSON scalar's identity answers as it is and graphql-core takes as
# a value (an Exception, or Undefined, it would not).
_JSON_AS_IS = frozenset({RawJSON, dict, list, str, int, float, bool})


def coerced(coerce: Callable[[Any], Any], value: Any) -> Any:
    """``value`` as its scalar's ``coerce`` answers it, or Unfit where
    graphql-core would answer an error: an exception (graphql-core raises a
    value that is one), a value the scalar refuses, or turns into null."""
    if isinstance(value, Exception):
        raise Unfit
    try:
        out = coerce(value)
    except Exception:
        raise Unfit from None
    if out is None or out is Undefined:
        raise Unfit
    return out


def instance_of(is_type_of: Callable[[Any, Any], Any]) -> tuple[type, ...] | None:
    """The classes Strawberry's own ``is_type_of`` of an object type accepts
    any instance of that is not cast (``strawberry.cast``) to a type: the
    type and its interfaces, held by the function it makes for each type.
    None for any other function, or one whose shape this does not know."""
    code, cells = getattr(is_type_of, "__code__", None), getattr(is_type_of, "__closure__", None)
    if (
        code is None
        or cells is None
        or getattr(is_type_of, "__module__", None) != "strawberry.schema.schema_converter"
        or not is_type_of.__qualname__.endswith("._get_is_type_of.<locals>.is_type_of")
    ):
        return None
    held = dict(zip(code.co_freevars, cells, strict=True))
    try:
        classes = held["possible_types"].cell_contents
    except (KeyError, ValueError):
        return None
    if type(classes) is not tuple or not all(isinstance(c, type) for c in classes):
        return None
    return classes


def _int(value: Any) -> Any:
    # serialize_int returns an int within 32 bits as it is; any other value
    # (a bool, a float, a larger int) takes its own path.
    if type(value) is int and -2_147_483_648 <= value <= 2_147_483_647:
        return value
    return coerced(scalars.serialize_int, value)


class Field:
    """One response key of an object's plan, as the document selects it."""

    __slots__ = ("attribute", "coerce", "counted", "key", "non_null", "sub", "typename")

    def __init__(
        self,
        key: str,
        *,
        attribute: str | None = None,
        typename: str | None = None,
        coerce: Callable[[Any], Any] | None = None,
        sub: Shape | None = None,
        non_null: bool = False,
        counted: bool = False,
    ) -> None:
        self.key, self.attribute, self.typename = key, attribute, typename
        self.coerce, self.sub, self.non_null, self.counted = coerce, sub, non_null, counted


class Shape:
    """An object type's selection: its ``is_type_of`` and its fields in order."""

    __slots__ = ("fields", "is_type_of", "name")

    def __init__(
        self, name: str, is_type_of: Callable[[Any, Any], Any] | None, fields: list[Field]
    ) -> None:
        self.name, self.is_type_of, self.fields = name, is_type_of, fields


def compile_shape(shape: Shape) -> Build:
    """``shape`` as one generated function per object it reaches."""
    names: dict[str, Any] = {
        "Unfit": Unfit,
        "coerced": coerced,
        "_int": _int,
        "_JSON_AS_IS": _JSON_AS_IS,
        "RawJSON": RawJSON,
        "_fragment": orjson.Fragment,
    }
    lines: list[str] = []
    counter = itertools.count()

    def emit(s: Shape) -> str:
        fn = f"build_{next(counter)}"
        body: list[str] = []
        if s.is_type_of is not None:
            names[f"{fn}_is"] = s.is_type_of
            # Strawberry's is_type_of looks only at the object, not the info.
            check = f"{fn}_is(src, None) is not True"
            classes = instance_of(s.is_type_of)
            if classes is not None:
                # Its answer for an object not cast to a type and an instance
                # of one of these is True: that case asks no call.
                names[f"{fn}_classes"] = classes
                check = (
                    f"(getattr(src, {TYPE_CAST_ATTRIBUTE!r}, None) is not None"
                    f" or not isinstance(src, {fn}_classes)) and {check}"
                )
            body.append(f"if {check}: raise Unfit")
        reads = [(i, f) for i, f in enumerate(s.fields) if f.attribute is not None]
        if reads:
            body.append("try:")
            for i, f in reads:
                assert f.attribute is not None
                if not f.attribute.isidentifier() or keyword.iskeyword(f.attribute):
                    raise Unfit
                body.append(f"    v{i} = src.{f.attribute}")
            # An attribute that raises is an error at the item's field:
            # graphql-core's path reports it there, not at the list.
            body.append("except Exception: raise Unfit from None")
        items: list[str] = []
        for i, f in reads:
            value = f"v{i}"
            if f.sub is not None:
                done = f"{emit(f.sub)}({value}, charge)"
            elif f.coerce is scalars.serialize_int:
                # _int's own test, inline: a seq is a plain int every time.
                done = (
                    f"({value} if type({value}) is int and -2147483648 <= {value} <= 2147483647"
                    f" else _int({value}))"
                )
            else:
                names[f"{fn}_c{i}"] = f.coerce
                exact = _UNCHANGED.get(f.coerce)
                general = f"coerced({fn}_c{i}, {value})"
                test = "in" if exact == "_JSON_AS_IS" else "is"
                done = (
                    f"({value} if type({value}) {test} {exact} else {general})"
                    if exact is not None
                    else general
                )
                if exact == "_JSON_AS_IS":
                    # JSON text read to be passed on: the fragment the
                    # answer's encoder would ask for it (keyturn.http.app),
                    # made here, where orjson's call back into Python for
                    # each event of a page was a thirtieth of the page.
                    done = f"(_fragment({value}.text) if type({value}) is RawJSON else {done})"
            if f.non_null:
                body.append(f"if {value} is None: raise Unfit")
                body.append(f"c{i} = {done}")
            else:
                body.append(f"c{i} = None if {value} is None else {done}")
            if f.counted:
                body.append(f"charge({value})")
        for i, f in enumerate(s.fields):
            out = repr(f.typename) if f.attribute is None else f"c{i}"
            items.append(f"{f.key!r}: {out}")
        body.append("return {" + ", ".join(items) + "}")
        lines.append(f"def {fn}(src, charge):")
        lines.extend("    " + b for b in body)
        return fn

    top = emit(shape)
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<plan {shape.name}>", "exec"), names)
    return names[top]  # type: ignore[no-any-return]


class Plans:
    """Compiled plans kept across operations, by what they were compiled
    from (the schema, a type and the field nodes of a selection, or an
    operation's node), at most ``limit`` of them; None where no plan could
    be. A key holds its objects, so their ids cannot be reused while it is
    kept."""

    __slots__ = ("_kept", "limit")

    def __init__(self, limit: int = 2048) -> None:
        self.limit = limit
        self._kept: dict[tuple[int, ...], tuple[tuple[Any, ...], Any]] = {}

    def get(self, held: tuple[Any, ...]) -> tuple[bool, Any]:
        found = self._kept.get(tuple(map(id, held)))
        if found is None or any(a is not b for a, b in zip(found[0], held, strict=True)):
            return False, None
        return True, found[1]

    def keep(self, held: tuple[Any, ...], plan: Any) -> None:
        if len(self._kept) >= self.limit:
            self._kept.clear()
        self._kept[tuple(map(id, held))] = (held, plan)


PLANS = Plans()

__all__ = [
    "PLANS",
    "Build",
    "Field",
    "Plans",
    "Shape",
    "Unfit",
    "coerced",
    "compile_shape",
    "instance_of",
    "no_charge",
]
