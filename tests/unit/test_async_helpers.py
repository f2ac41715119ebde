"""The helpers graphql-core hands every resolver for its asynchronous work
(``info.async_helpers``: gather, and track for work settled in the
background) do what they do under graphql-core's own execution context,
now that FastLists binds them weakly: during the operation, and after it
has ended and its context is gone."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import strawberry
from graphql import GraphQLResolveInfoHelpers
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

from keyturn.schema.execution import FastLists

settled: list[str] = []
kept: list[GraphQLResolveInfoHelpers] = []


async def _work(name: str) -> str:
    await asyncio.sleep(0)
    settled.append(name)
    return name


async def _failing() -> None:
    settled.append("failing")
    raise RuntimeError("observed, not raised into the answer")


def _helpers(info: strawberry.Info) -> GraphQLResolveInfoHelpers:
    helpers: GraphQLResolveInfoHelpers = info._raw_info.async_helpers
    return helpers


@strawberry.type
class Query:
    @strawberry.field
    async def gathered(self, info: strawberry.Info) -> list[str]:
        return list(await _helpers(info).gather([_work("a"), _work("b")]))

    @strawberry.field
    def tracked(self, info: strawberry.Info) -> str:
        helpers = _helpers(info)
        helpers.track([_work("during"), _failing(), "not awaitable"])
        kept.append(helpers)
        return "ok"


def _schema(context_class: type[Any]) -> strawberry.Schema:
    return strawberry.Schema(query=Query, execution_context_class=context_class)


async def _until(names: set[str]) -> None:
    for _ in range(100):
        if names <= set(settled):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never settled: {names - set(settled)}")


async def test_gather_answers_as_under_graphql_core() -> None:
    for context_class in (StrawberryGraphQLCoreExecutionContext, FastLists):
        result = await _schema(context_class).execute("{ gathered }")
        assert result.errors is None, result.errors
        assert result.data == {"gathered": ["a", "b"]}


async def test_tracked_work_is_settled_during_and_after_the_operation() -> None:
    for context_class in (StrawberryGraphQLCoreExecutionContext, FastLists):
        settled.clear()
        kept.clear()
        result = await _schema(context_class).execute("{ tracked }")
        assert result.errors is None, result.errors
        assert result.data == {"tracked": "ok"}
        await _until({"during", "failing"})
        # The operation is over; with FastLists its context is gone, and
        # work tracked now is settled all the same.
        del result
        gc.collect()
        kept[0].track([_work("after")])
        await _until({"after"})
