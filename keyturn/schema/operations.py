"""A whole query compiled to a plan, run without graphql-core's field machinery.

graphql-core executes every field the same way: a path, a resolve info, the
arguments, the resolver, then a completion that dispatches on the field's
type, collects the sub-selection and does it all again one level down. For
a document the server sees again and again (a page of events, a session
with its turns) that dispatch is decided by the schema and the document
alone, so it is decided once: :func:`compile_operation` turns an operation's
selection into completers, one per field, with the plain parts (attributes,
leaves, lists of plain objects) generated as code by keyturn.schema.plans,
and the plan is kept with the operation's nodes.

A plan is the happy path and nothing else. The resolvers it calls are the
schema's own (called as Strawberry's wrapper calls them, keyturn.schema.calls,
or through the wrapper where it does more: extensions, a conversion of its
own), with the resolve info and the arguments
graphql-core would give them, in the same order, and sibling fields (and the
items of a list) awaited together as graphql-core does, so a page of
sessions still loads its events in one batch. The moment anything is not
the plain case — a resolver that raises, a null where the schema says
non-null, a value its scalar refuses, a list that is not a list, an object
its type does not claim, the response-size limit — the plan gives up
(:class:`Unfit`) and graphql-core executes the operation, which decides the
answer and its errors. No resolver runs twice: what each one the plan
called gave (its value or its exception) is kept by its path
(``FastLists.outcomes``), and graphql-core is given that instead of calling
it again (keyturn.schema.execution.Replay), so a field that failed because
the database was busy fails the same way rather than being read a second
time, and a busy server is not asked twice. Queries take this path, and
mutations of one root field: graphql-core runs a mutation's root fields one
after another, which for one field is what a plan does, and a mutation whose
plan gives up has made its write once, graphql-core being given its outcome
as any other (a replayed submitTurn took 0.93 of the CPU it took without, in
one process, the two in turn). Mutations of several root fields,
introspection, directives and subscriptions are left to graphql-core.

That the two answer the same bytes is what
tests/integration/test_fast_lists_differential.py checks, on every query of
the suite, thousands generated from the schema and the suite's mutations
that write nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from graphql import (
    GraphQLInterfaceType,
    GraphQLLeafType,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLUnionType,
    is_abstract_type,
    is_leaf_type,
    is_object_type,
)
from graphql.execution.collect_fields import FieldDetailsList, collect_fields
from graphql.execution.values import get_argument_values
from graphql.language import OperationType
from graphql.pyutils import Path

from keyturn.schema.calls import direct_call
from keyturn.schema.plans import Build, Field, Shape, Unfit, coerced, compile_shape

if TYPE_CHECKING:
    from keyturn.schema.execution import FastLists

# A field's completion: the resolved value, its path, its resolve info, the
# execution and the charge of the response budget; the completed value, or
# an awaitable of it.
Complete = Callable[[Any, "Path | None", Any, "FastLists", Callable[[Any], None]], Any]
# A query's plan: its data, or an awaitable of it; Unfit when graphql-core must answer.
Run = Callable[["FastLists", Callable[[Any], None]], "dict[str, Any] | Awaitable[dict[str, Any]]"]


def _close(values: list[Any]) -> None:
    """Resolvers' coroutines that will not be awaited (and what a plan's own
    awaitables wait for), closed rather than left to warn; anything else (a
    loader's future) settles by itself."""
    for value in values:
        if isinstance(value, _Later) or hasattr(value, "cr_frame"):
            value.close()


class _Later:
    """What an object's or a list's completion still waits for, awaited
    once; closed with all it holds when the plan gives up before."""

    __slots__ = ("args", "holds", "run")

    def __init__(self, run: Callable[..., Any], args: tuple[Any, ...], holds: list[Any]) -> None:
        self.run, self.args, self.holds = run, args, holds

    def __await__(self) -> Any:
        return self.run(*self.args).__await__()

    def close(self) -> None:
        _close(self.holds)


class _Resolved:
    """One response key whose value comes from its field's resolver."""

    __slots__ = ("args", "complete", "field", "key", "node", "nodes", "resolve")

    def __init__(
        self,
        key: str,
        field: Any,
        details: FieldDetailsList,
        complete: Complete,
        resolve: Callable[..., Any],
    ) -> None:
        self.key, self.field, self.complete = key, field, complete
        self.node = details[0].node
        self.nodes = [d.node for d in details]
        self.resolve = resolve
        self.args = bool(field.args or self.node.arguments)


# Resolved fields still to arrive: the field, its value (awaitable), its path
# (None for a value already completed that is itself still to arrive) and
# its resolve info.
Waiting = list[tuple[_Resolved, Any, "Path | None", Any]]


class _Compiler:
    """Builds completers for one operation, from its execution context's
    schema, fragments and variables (only ever compiled when no directive
    lets the variables decide what is selected)."""

    def __init__(self, execution: FastLists) -> None:
        self.execution = execution
        # The Strawberry schema of the GraphQL one, whose resolvers a plan
        # calls without their wrapper (keyturn.schema.calls).
        self.strawberry = getattr(execution.schema, "_strawberry_schema", None)

    def complete(self, field_type: GraphQLOutputType, details: FieldDetailsList) -> Complete:
        non_null = isinstance(field_type, GraphQLNonNull)
        inner = field_type.of_type if isinstance(field_type, GraphQLNonNull) else field_type
        if is_leaf_type(inner):
            assert isinstance(inner, GraphQLLeafType)
            done = _leaf(inner.coerce_output_value)
        elif isinstance(inner, GraphQLList):
            done = self._list(inner.of_type, details)
        elif is_object_type(inner):
            assert isinstance(inner, GraphQLObjectType)
            done = self._object(inner, details)
        elif is_abstract_type(inner):
            assert isinstance(inner, GraphQLInterfaceType | GraphQLUnionType)
            done = self._abstract(inner, details)
        else:
            raise Unfit
        if non_null:

            def required(
                value: Any, path: Path | None, info: Any, ex: FastLists, charge: Any
            ) -> Any:
                if value is None:
                    raise Unfit
                return done(value, path, info, ex, charge)

            return required

        def nullable(value: Any, path: Path | None, info: Any, ex: FastLists, charge: Any) -> Any:
            return None if value is None else done(value, path, info, ex, charge)

        return nullable

    def _list(self, item_type: GraphQLOutputType, details: FieldDetailsList) -> Complete:
        build = self._plain_items(item_type, details)
        if build is not None:
            return _plain_list(build)
        item = self.complete(item_type, details)

        def items(value: Any, path: Path | None, info: Any, ex: FastLists, charge: Any) -> Any:
            # graphql-core takes any iterable; a plan only the list resolvers return.
            if type(value) is not list:
                raise Unfit
            is_awaitable = ex.is_awaitable
            done: list[Any] = []
            try:
                for i, v in enumerate(value):
                    done.append(item(v, Path(path, i, None), info, ex, charge))
            except Exception:
                _close([d for d in done if is_awaitable(d)])
                raise Unfit from None
            pending = [i for i, d in enumerate(done) if is_awaitable(d)]
            if not pending:
                return done
            return _Later(_gathered, (done, pending), [done[i] for i in pending])

        return items

    def _plain_items(self, item_type: GraphQLOutputType, details: FieldDetailsList) -> Build | None:
        """The generated plan of a list's items when they are non-null
        objects whose every selected field is plain (a page's edges)."""
        if not isinstance(item_type, GraphQLNonNull) or not is_object_type(item_type.of_type):
            return None
        assert isinstance(item_type.of_type, GraphQLObjectType)
        return self.execution._compiled(item_type.of_type, details)

    def _abstract(
        self, abstract: GraphQLInterfaceType | GraphQLUnionType, details: FieldDetailsList
    ) -> Complete:
        """An interface or a union: its type resolver names the object type
        (graphql-core's call, with the field's info), whose completer is one
        compiled for each possible type."""
        schema = self.execution.schema
        by_name = {t.name: self._object(t, details) for t in schema.get_possible_types(abstract)}
        resolve_type = abstract.resolve_type

        def resolved(value: Any, path: Path | None, info: Any, ex: FastLists, charge: Any) -> Any:
            try:
                name = (resolve_type or ex.type_resolver)(value, info, abstract)
            except Exception:
                raise Unfit from None
            # A name graphql-core would refuse, or one still to be awaited.
            done = by_name.get(name) if type(name) is str else None
            if done is None:
                raise Unfit
            return done(value, path, info, ex, charge)

        return resolved

    def _object(self, object_type: GraphQLObjectType, details: FieldDetailsList) -> Complete:
        # The generated plan, when every field selected is plain.
        build = self.execution._compiled(object_type, details)
        if build is not None:
            return lambda value, _path, _info, _ex, charge: build(value, charge)
        grouped, defers, _ = self.execution.collect_subfields(object_type, details)
        if defers:
            raise Unfit
        return self.fields(object_type, grouped)

    def fields(
        self,
        object_type: GraphQLObjectType,
        grouped: dict[str, FieldDetailsList],
        *,
        root: bool = False,
    ) -> Complete:
        """The completer of an object some of whose fields resolve: the plain
        ones read as one generated plan, the others by their resolvers. The
        root's type is not asked whether it claims the root value (graphql-core
        does not ask either)."""
        name = object_type.name
        is_type_of = None if root else object_type.is_type_of
        plain: dict[str, Field] = {}
        resolved: list[_Resolved] = []
        for key, details in grouped.items():
            node = details[0].node
            field_name = node.name.value
            if any(d.fragment_variable_values is not None for d in details):
                raise Unfit
            if field_name != "__typename" and field_name not in object_type.fields:
                raise Unfit  # introspection's fields: graphql-core's
            # __typename, or a plain attribute plain all the way down: read by the plan.
            try:
                plain[key] = self.execution._field_plan(object_type, key, details)
                continue
            except Unfit:
                pass
            field = object_type.fields[field_name]
            if field.resolve is None:  # graphql-core's default resolver
                raise Unfit
            resolve = direct_call(self.strawberry, field) if self.strawberry else None
            done = self.complete(field.type, details)
            resolved.append(_Resolved(key, field, details, done, resolve or field.resolve))
        keys = list(grouped)
        # Plain keys are answered first, the resolved after them: in the
        # document's order again only where the two interleave.
        reorder = keys != [*plain, *(r.key for r in resolved)]
        read = None
        if plain:
            read = compile_shape(Shape(name, None, list(plain.values())))

        def complete(source: Any, path: Path | None, _info: Any, ex: FastLists, charge: Any) -> Any:
            # Strawberry's is_type_of looks only at the object, not the info.
            if is_type_of is not None and is_type_of(source, None) is not True:  # type: ignore[arg-type]
                raise Unfit
            is_awaitable = ex.is_awaitable
            # As graphql-core: every resolver called in the document's order,
            # a value that is there completed at once (its own resolvers
            # called then), the awaited ones completed as they arrive.
            waiting: Waiting = []
            try:
                out = read(source, charge) if read is not None else {}
                for r in resolved:
                    field_path = Path(path, r.key, name)
                    info = ex.build_resolve_info(r.field, r.nodes, object_type, field_path)
                    args = (
                        get_argument_values(
                            r.field, r.node, ex.variable_values, None, ex.hide_suggestions
                        )
                        if r.args
                        else {}
                    )
                    try:
                        value = r.resolve(source, info, **args)
                    except Exception as error:
                        ex.outcomes.append((field_path, False, error))
                        raise
                    if is_awaitable(value):
                        out[r.key] = None
                        waiting.append((r, value, field_path, info))
                    else:
                        ex.outcomes.append((field_path, True, value))
                        value = r.complete(value, field_path, info, ex, charge)
                        out[r.key] = value
                        if is_awaitable(value):
                            waiting.append((r, value, None, info))
            except Exception:
                _close([w[1] for w in waiting])
                raise Unfit from None
            if reorder:
                out = {k: out[k] for k in keys}
            if not waiting:
                return out
            return _Later(_filled, (out, waiting, ex, charge), [w[1] for w in waiting])

        return complete


def _plain_list(build: Build) -> Complete:
    """A list of non-null plain objects completed in one loop: a plan
    returns a dict, never an awaitable, and needs no path (a failing item
    gives up the whole plan, whose path graphql-core then reports)."""

    def items(value: Any, _path: Path | None, _info: Any, _ex: FastLists, charge: Any) -> Any:
        if type(value) is not list:
            raise Unfit
        done: list[Any] = []
        append = done.append
        try:
            for v in value:
                if v is None:
                    raise Unfit
                append(build(v, charge))
        except Exception:  # the response budget's charge among them
            raise Unfit from None
        return done

    return items


def _leaf(coerce: Callable[[Any], Any]) -> Complete:
    def leaf(value: Any, _path: Path | None, _info: Any, _ex: FastLists, _charge: Any) -> Any:
        return coerced(coerce, value)

    return leaf


async def _then(waited: tuple[_Resolved, Any, Path | None, Any], ex: FastLists, charge: Any) -> Any:
    """One field's value awaited and completed (a path: still to complete)."""
    r, value, path, info = waited
    try:
        if path is None:
            return await value
        try:
            done = await value
        except Exception as error:
            ex.outcomes.append((path, False, error))
            raise
        ex.outcomes.append((path, True, done))
        done = r.complete(done, path, info, ex, charge)
        if ex.is_awaitable(done):
            done = await done
    except Unfit:
        raise
    except Exception:
        raise Unfit from None
    return done


async def _filled(
    out: dict[str, Any], waiting: Waiting, ex: FastLists, charge: Any
) -> dict[str, Any]:
    if len(waiting) == 1:
        out[waiting[0][0].key] = await _then(waiting[0], ex, charge)
    else:
        done = await _all(*(_then(w, ex, charge) for w in waiting))
        for w, value in zip(waiting, done, strict=True):
            out[w[0].key] = value
    return out


async def _all(*awaitables: Any) -> list[Any]:
    """Every awaitable's value, awaited together; Unfit once all are done if
    any failed. Not graphql-core's gather_with_cancel: a sibling cancelled
    mid-read would leave no outcome for graphql-core to be given (Replay),
    which would then read it again, and a read cut off in the middle costs
    its connection."""
    values = await asyncio.gather(*awaitables, return_exceptions=True)
    if any(isinstance(v, BaseException) for v in values):
        raise Unfit
    return values


async def _gathered(done: list[Any], pending: list[int]) -> list[Any]:
    try:
        if len(pending) == 1:
            done[pending[0]] = await done[pending[0]]
        else:
            values = await _all(*(done[i] for i in pending))
            for i, v in zip(pending, values, strict=True):
                done[i] = v
    except Unfit:
        raise
    except Exception:
        raise Unfit from None
    return done


def compile_operation(execution: FastLists) -> Run | None:
    """The plan of ``execution``'s query or mutation, or None where
    graphql-core must run it."""
    schema = execution.schema
    mutation = execution.operation.operation is OperationType.MUTATION
    root_type = schema.mutation_type if mutation else schema.query_type
    if root_type is None:
        return None
    grouped, defers, _ = collect_fields(
        schema,
        execution.fragments,
        execution.variable_values,
        root_type,
        execution.operation,
        execution.hide_suggestions,
    )
    if defers:
        return None
    if mutation and len(grouped) != 1:
        # graphql-core runs a mutation's root fields one after another, each
        # completed before the next starts; a plan runs siblings together.
        return None
    try:
        root = _Compiler(execution).fields(root_type, grouped, root=True)
    except Unfit:
        return None

    def run(ex: FastLists, charge: Callable[[Any], None]) -> Any:
        return root(ex.root_value, None, None, ex, charge)

    return run
