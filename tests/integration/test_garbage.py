"""What a request makes is freed when it ends, by reference counting, not
left in reference cycles for the cycle collector to find later.

An operation's execution context is reachable from everything a resolver
is given; one cycle through it keeps the whole answer (a page's hundred
events, the request, the context) alive after the response is sent, and
under load collecting those cycles cost a quarter of a page's CPU.

One in-process server, the collector switched off while one request runs,
then run by hand with every object it finds kept for inspection. An
error's answer is not covered: its traceback holds the frames it passed
through, a cycle Python makes of every caught exception."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.support import GraphQLClient

PAGE = (
    "query($id: ID!, $after: String) { session(id: $id) { events(first: 100, after: $after) "
    "{ edges { cursor node { seq type data } } pageInfo { hasNextPage endCursor } } } }"
)
SESSION_AND_TURNS = (
    "query($id: ID!) { session(id: $id) { id eventCount "
    "turns(first: 10) { totalCount edges { cursor node { id status output } } } } }"
)
TURN = "query($id: ID!) { turn(id: $id) { id status events { seq type data } } }"

# Where the objects of an operation's answer are made. Other parts of the
# process (the pool, the HTTP client) may make cycles of their own.
ANSWER_MODULES = ("keyturn.", "graphql.execution", "strawberry.")


@contextmanager
def cyclic_garbage() -> Iterator[list[str]]:
    """The types of the objects only the cycle collector would have freed,
    of what runs inside the block (names, not the objects: kept, they would
    be found again by the next block)."""
    found: list[str] = []
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found.extend(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def answer_objects(garbage: list[str]) -> list[str]:
    return sorted({name for name in garbage if name.startswith(ANSWER_MODULES)})


async def test_an_answer_is_freed_when_its_request_ends(client: GraphQLClient) -> None:
    session = await client.create_session()
    key = uuid.uuid4().hex
    admitted = await client.submit(session, key, "hello")
    turn_id = str(admitted["turn"]["id"])
    await client.wait_for_status(turn_id, {"COMPLETED"})

    requests: dict[str, Callable[[], Awaitable[Any]]] = {
        "a page of events": lambda: client.execute(PAGE, {"id": session, "after": None}),
        "a session and its turns": lambda: client.execute(SESSION_AND_TURNS, {"id": session}),
        "a turn and its events": lambda: client.execute(TURN, {"id": turn_id}),
        "a replayed submitTurn": lambda: client.submit(session, key, "hello"),
        "a conflicting submitTurn": lambda: client.submit(session, key, "changed"),
    }
    for name, send in requests.items():
        # Twice first: the document's parse, validation and plan are kept
        # for the process's life, and made once.
        await send()
        await send()
        with cyclic_garbage() as garbage:
            answer = await send()
        assert answer, name
        assert answer_objects(garbage) == [], name


async def test_a_turn_is_freed_when_it_ends(client: GraphQLClient) -> None:
    session = await client.create_session()
    first = await client.submit(session, uuid.uuid4().hex, "hello")
    await client.wait_for_status(str(first["turn"]["id"]), {"COMPLETED"})
    with cyclic_garbage() as garbage:
        admitted = await client.submit(session, uuid.uuid4().hex, "hello again")
        # Admitted, claimed, its output written as it came, completed.
        ended = await client.wait_for_status(str(admitted["turn"]["id"]), {"COMPLETED"})
    assert ended["output"], ended
    assert answer_objects(garbage) == []
