"""An operation prepared once per document (keyturn.schema.prepared) is built
into the executor graphql-core's own ``build`` makes: the same operation and
fragments, the same coerced variables and their sources, and, for any value
that does not coerce, the same errors (graphql-core's, word for word)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from graphql import (
    GraphQLInputField,
    GraphQLInputObjectType,
    GraphQLInt,
    GraphQLList,
    GraphQLNonNull,
    GraphQLSchema,
    GraphQLString,
    Undefined,
    is_input_type,
    parse,
)
from graphql.execution import Executor
from graphql.utilities import coerce_input_value
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyturn.domain import History, Multitask
from keyturn.schema import schema as keyturn_schema
from keyturn.schema.execution import PREPARED, FastLists
from keyturn.schema.prepared import coercer, prepare

SCHEMA: GraphQLSchema = keyturn_schema._schema

SUBMIT = """
mutation Submit($i: SubmitTurnInput!) { submitTurn(input: $i) { __typename } }
"""
DOCUMENTS = {
    "submit": SUBMIT,
    "defaults": """
        query Page($id: ID!, $first: Int = 5, $after: String, $h: HistoryMode = NONE) {
          session(id: $id) { events(first: $first, after: $after) { edges { cursor } } }
        }""",
    "object default": """
        mutation Create($i: CreateSessionInput = {defaultHistory: NONE}) {
          createSession(input: $i) { id }
        }""",
    "lists": "query Nodes($ids: [ID!]!) { nodes(ids: $ids) { id } }",
    "fragments": """
        query One($id: ID!) { session(id: $id) { ...S } }
        query Two($id: ID!, $first: Int!) {
          session(id: $id) { ...S turns(first: $first) { edges { cursor } } }
        }
        fragment S on Session { id defaultHistory }""",
    "decide": """
        mutation Decide($i: DecideToolCallInput!) {
          decideToolCall(input: $i) { __typename }
        }""",
    "resolve": """
        mutation R($i: ResolveInterruptedTurnInput!) {
          resolveInterruptedTurn(input: $i) { __typename }
        }""",
}


def built(cls: type[Executor[Any]], text_or_doc: Any, variables: Any, name: str | None) -> Any:
    document = parse(text_or_doc) if isinstance(text_or_doc, str) else text_or_doc
    return cls.build(SCHEMA, document, raw_variable_values=variables, operation_name=name)


def same(document: Any, variables: Any, name: str | None) -> None:
    ours = built(FastLists, document, variables, name)
    theirs = built(Executor, document, variables, name)
    if isinstance(theirs, list):
        assert isinstance(ours, list)
        assert [e.formatted for e in ours] == [e.formatted for e in theirs]
        return
    assert isinstance(ours, FastLists)
    assert ours.operation is theirs.operation
    assert ours.fragment_definitions == theirs.fragment_definitions
    assert ours.fragments.keys() == theirs.fragments.keys()
    for key, details in ours.fragments.items():
        assert details.definition is theirs.fragments[key].definition
        assert details.variable_signatures == theirs.fragments[key].variable_signatures
    assert typed(ours.variable_values.coerced) == typed(theirs.variable_values.coerced)
    assert ours.variable_values.sources.keys() == theirs.variable_values.sources.keys()
    for key, source in ours.variable_values.sources.items():
        other = theirs.variable_values.sources[key]
        assert source.value is other.value
        assert source.signature.name == other.signature.name
        assert str(source.signature.type) == str(other.signature.type)
        assert (source.signature.default is None) == (other.signature.default is None)
        if source.signature.default is not None:
            assert source.signature.default.literal is other.signature.default.literal


def typed(value: Any) -> Any:
    """``value`` with every leaf's type beside it: True, 1 and 1.0 are equal
    in Python, and not the same coercion."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value), value)


SESSION = "U2Vzc2lvbjpjMGEwMDAwMC0wMDAwLTAwMDAtMDAwMC0wMDAwMDAwMDAwMDE="


@pytest.mark.parametrize(
    ("doc", "variables", "name"),
    [
        ("submit", {"i": {"sessionId": SESSION, "idempotencyKey": "k", "input": "hi"}}, None),
        ("submit", {"i": {"sessionId": SESSION, "idempotencyKey": "k", "input": "hi"}}, "Submit"),
        ("submit", {"i": {"sessionId": 7, "idempotencyKey": "k", "input": "x"}}, None),
        (
            "submit",
            {
                "i": {
                    "sessionId": SESSION,
                    "idempotencyKey": "k",
                    "input": "x",
                    "history": "NONE",
                    "multitask": "REJECT",
                }
            },
            None,
        ),
        (
            "submit",
            {"i": {"sessionId": SESSION, "idempotencyKey": "k", "input": "x", "history": None}},
            None,
        ),
        # Every kind of error: graphql-core's messages.
        ("submit", {"i": {"sessionId": SESSION, "idempotencyKey": "k", "input": 3}}, None),
        ("submit", {"i": {"sessionId": SESSION, "idempotencyKey": "k"}}, None),
        (
            "submit",
            {"i": {"sessionId": SESSION, "idempotencyKey": "k", "input": "x", "extra": 1}},
            None,
        ),
        (
            "submit",
            {"i": {"sessionId": SESSION, "idempotencyKey": "k", "input": "x", "history": "SOME"}},
            None,
        ),
        ("submit", {"i": None}, None),
        ("submit", {"i": "text"}, None),
        ("submit", {}, None),
        ("submit", None, None),
        ("submit", {"i": {"sessionId": SESSION, "idempotencyKey": "k", "input": "hi"}}, "Other"),
        ("defaults", {"id": SESSION}, None),
        ("defaults", {"id": SESSION, "first": 3, "after": None, "h": "FULL"}, None),
        ("defaults", {"id": SESSION, "first": None}, None),
        ("defaults", {"id": SESSION, "first": 2.0}, None),
        ("defaults", {"id": SESSION, "first": 2.5}, None),
        ("defaults", {"id": SESSION, "first": True}, None),
        ("defaults", {"id": SESSION, "first": 2**40}, None),
        ("defaults", {"id": SESSION, "unknown": 1}, None),
        ("object default", {}, None),
        ("object default", {"i": None}, None),
        ("object default", {"i": {"multitask": "INTERRUPT"}}, None),
        ("lists", {"ids": [SESSION, "x", 3]}, None),
        ("lists", {"ids": SESSION}, None),
        ("lists", {"ids": [SESSION, None]}, None),
        ("lists", {"ids": []}, None),
        ("lists", {"ids": {"a": 1}}, None),
        ("fragments", {"id": SESSION}, None),
        ("fragments", {"id": SESSION}, "One"),
        ("fragments", {"id": SESSION, "first": 2}, "Two"),
        ("fragments", {"id": SESSION}, "Two"),
        ("fragments", {"id": SESSION}, "Three"),
        (
            "decide",
            {"i": {"turnId": SESSION, "index": 0, "decision": "APPROVE", "idempotencyKey": "d"}},
            None,
        ),
        (
            "decide",
            {"i": {"turnId": SESSION, "index": "0", "decision": "APPROVE", "idempotencyKey": "d"}},
            None,
        ),
        ("resolve", {"i": {"turnId": SESSION, "action": "RETRY", "idempotencyKey": "r"}}, None),
        (
            "resolve",
            {"i": {"turnId": SESSION, "action": "RETRY", "idempotencyKey": "r", "force": 1}},
            None,
        ),
    ],
)
def test_an_operation_is_built_as_graphql_core_builds_it(
    doc: str, variables: Any, name: str | None
) -> None:
    document = parse(DOCUMENTS[doc])
    # Twice: once preparing the document, once from what was kept.
    same(document, variables, name)
    same(document, variables, name)


def test_what_is_prepared_is_kept_per_document_and_name() -> None:
    document = parse(DOCUMENTS["fragments"])
    variables = {"id": SESSION}
    one = built(FastLists, document, variables, "One")
    again = built(FastLists, document, variables, "One")
    assert one.operation is again.operation
    found, by_name = PREPARED.get((SCHEMA, document))
    assert found
    assert by_name["One"] is not None
    # No name, with two operations: graphql-core answers, and so nothing is prepared.
    assert None not in by_name
    assert isinstance(built(FastLists, document, variables, None), list)
    assert by_name[None] is None


def test_a_default_is_coerced_for_each_operation_not_shared() -> None:
    document = parse(DOCUMENTS["object default"])
    first = built(FastLists, document, {}, None).variable_values.coerced["i"]
    second = built(FastLists, document, {}, None).variable_values.coerced["i"]
    assert first == second == {"defaultHistory": History.NONE, "multitask": Multitask.ENQUEUE}
    assert first is not second


def test_a_document_graphql_core_would_refuse_is_not_prepared() -> None:
    two = parse(
        "query A { serverPolicy { keyRetention } } query B { serverPolicy { keyRetention } }"
    )
    assert prepare(SCHEMA, two, None) is None
    assert prepare(SCHEMA, two, "C") is None
    assert prepare(SCHEMA, two, "B") is not None
    # A variable of a type that is no input type: validation refuses it first,
    # and graphql-core's build answers it again.
    wrong = parse("query ($s: Session) { serverPolicy { keyRetention } }")
    assert prepare(SCHEMA, wrong, None) is None
    same(wrong, {"s": 1}, None)


KEYS = ["sessionId", "idempotencyKey", "input", "history", "multitask", "extra"]
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "k", SESSION, "FULL", "NONE", "REJECT", "ENQUEUE", "x" * 300]),
    st.text(max_size=5),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6),
        VALUES,
    ),
    st.sampled_from(sorted(DOCUMENTS)),
)
def test_any_value_is_coerced_as_graphql_core_coerces_it(value: Any, doc: str) -> None:
    document = parse(DOCUMENTS[doc])
    for variable in ("i", "id", "ids", "first", "after", "h"):
        same(document, {variable: value}, None if doc != "fragments" else "Two")


def _input_types() -> list[str]:
    return sorted(
        name
        for name, type_ in SCHEMA.type_map.items()
        if is_input_type(type_) and not name.startswith("__")
    )


# Every input field name of the schema, so that generated objects coerce as
# often as they fail.
FIELD_NAMES = sorted(
    {
        field
        for name in _input_types()
        if isinstance(SCHEMA.type_map[name], GraphQLInputObjectType)
        for field in cast(GraphQLInputObjectType, SCHEMA.type_map[name]).fields
    }
)
FIELD_VALUES = st.recursive(
    LEAVES | st.sampled_from(["APPROVE", "RETRY", "INTERRUPT", "0"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(FIELD_NAMES), inner, max_size=6)
    ),
    max_leaves=10,
)
WRAPPERS: dict[str, Callable[[Any], Any]] = {
    "T": lambda t: t,
    "T!": GraphQLNonNull,
    "[T]": GraphQLList,
    "[T!]!": lambda t: GraphQLNonNull(GraphQLList(GraphQLNonNull(t))),
}


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(_input_types()),
    st.sampled_from(sorted(WRAPPERS)),
    st.one_of(
        st.dictionaries(st.sampled_from(FIELD_NAMES), FIELD_VALUES, max_size=8), FIELD_VALUES
    ),
)
def test_a_types_coercer_coerces_any_value_as_graphql_core_does(
    name: str, wrapper: str, value: Any
) -> None:
    # Every input type of the schema (scalars, enums, input objects), bare
    # and wrapped, against graphql-core's coerce_input_value: the same value
    # of the same types, or Undefined from both.
    type_ = WRAPPERS[wrapper](SCHEMA.type_map[name])
    assert typed(coercer(type_)(value)) == typed(coerce_input_value(value, type_))


ONE_OF = GraphQLInputObjectType(
    "Either",
    {"a": GraphQLInputField(GraphQLString), "b": GraphQLInputField(GraphQLInt)},
    is_one_of=True,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.dictionaries(st.sampled_from(["a", "b", "c"]), LEAVES, max_size=3), LEAVES))
def test_a_one_of_coercer_coerces_as_graphql_core_does(value: Any) -> None:
    # No input type of the schema is @oneOf yet; the coercer keeps its rule.
    assert typed(coercer(ONE_OF)(value)) == typed(coerce_input_value(value, ONE_OF))


NESTS: GraphQLInputObjectType = GraphQLInputObjectType(
    "Tree", lambda: {"leaf": GraphQLInputField(GraphQLInt), "kids": GraphQLInputField(TREES)}
)
TREES: GraphQLList[GraphQLNonNull[GraphQLInputObjectType]] = GraphQLList(GraphQLNonNull(NESTS))


def test_a_type_that_holds_itself_is_coerced_by_graphql_core() -> None:
    # Unfolded, it would have no end: graphql-core's own function takes it.
    wrong = {"leaf": 1, "kids": [{"leaf": 2, "kids": []}, {"leaf": "x"}]}
    assert coercer(NESTS)(wrong) is Undefined
    assert coerce_input_value(wrong, NESTS) is Undefined
    tree = {"leaf": 1, "kids": [{"leaf": 2, "kids": []}, {"leaf": 3}]}
    assert coercer(TREES)(tree) == coerce_input_value(tree, TREES) == [tree]
