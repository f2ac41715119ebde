"""The REST peer: a minimal hand-written admission service, the honest reference.

``POST /sessions/{id}/turns`` with an ``Idempotency-Key`` header and a JSON body
``{"input": "...", "history": "FULL" | "NONE"}`` (history optional: the
session's default). Answers 202 for a new turn, 200 for a replay, 409 when the
key already names a different request, 404 for an unknown session, 422 for an
invalid request. ``GET /sessions/{id}/events?after=N&limit=100`` pages events.

It does the same durable work as Keyturn: one read (the session and the key),
then for a new key the one admission statement (lock the session row, claim
the key, insert the turn, bump the seq, append ``turn.started``, commit), and
when that statement loses a race a separate read of the winner and the same
fingerprint comparison. It skips what it does not need: GraphQL, an ORM, a
background worker, wake-ups for subscribers.

Run: ``uvicorn bench.peer:create_app --factory`` with ``PEER_DATABASE_URL`` set.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.common import (
    ADMIT,
    BY_KEY,
    EVENTS_AFTER,
    HISTORIES,
    LOOKUP,
    fingerprint,
    invalid_input,
    invalid_key,
)


def _json(status: int, body: Any) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _turn(row: Any, replayed: bool) -> dict[str, Any]:
    return {
        "turn": {"id": str(row["id"]), "status": row["status"], "admitSeq": row["admit_seq"]},
        "replayed": replayed,
    }


def _judge(existing: Any, fp: str, key: str) -> Response:
    if existing["fingerprint"] == fp:
        return _json(200, _turn(existing, True))
    return _json(
        409,
        {
            "error": "IDEMPOTENCY_CONFLICT",
            "idempotencyKey": key,
            "existingTurnId": str(existing["id"]),
        },
    )


async def _no_reset(_conn: asyncpg.Connection) -> None:
    # Keyturn's pool (SQLAlchemy) sends nothing when a connection goes back;
    # asyncpg's default would add a RESET ALL round trip to every request.
    return None


def create_app() -> Starlette:
    dsn = os.environ["PEER_DATABASE_URL"]
    pool_size = int(os.environ.get("PEER_POOL_SIZE", "20"))
    state: dict[str, asyncpg.Pool] = {}

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        # Keyturn's capacity: its requests' pool holds at most pool_size
        # connections (KEYTURN_POOL_SIZE); half of the peer's open at start.
        pool = await asyncpg.create_pool(
            dsn, min_size=max(1, pool_size // 2), max_size=pool_size, reset=_no_reset
        )
        state["pool"] = pool
        try:
            yield
        finally:
            await pool.close()

    async def submit(request: Request) -> Response:
        try:
            session_id = uuid.UUID(request.path_params["session_id"])
        except ValueError:
            return _json(404, {"error": "SESSION_NOT_FOUND"})
        key = request.headers.get("idempotency-key", "")
        problem = invalid_key(key)
        if problem:
            return _json(
                422, {"error": "INVALID_INPUT", "field": "Idempotency-Key", "message": problem}
            )
        try:
            body = orjson.loads(await request.body())
            text = body["input"]
            history = body.get("history")
            if not isinstance(text, str) or history not in (None, *HISTORIES):
                raise TypeError
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _json(422, {"error": "INVALID_INPUT", "field": "body"})
        problem = invalid_input(text)
        if problem:
            return _json(422, {"error": "INVALID_INPUT", "field": "input", "message": problem})

        async with state["pool"].acquire() as conn:
            found = await conn.fetchrow(LOOKUP, session_id, key)
            if found is None:
                return _json(404, {"error": "SESSION_NOT_FOUND"})
            effective = history or found["default_history"]
            fp = fingerprint(input=text, history=effective)
            if found["id"] is not None:
                return _judge(found, fp, key)
            row = await conn.fetchrow(ADMIT, session_id, key, uuid.uuid4(), fp, text, effective)
            if row is not None:
                return _json(202, _turn(row, False))
            winner = await conn.fetchrow(BY_KEY, session_id, key)
        if winner is None:
            return _json(404, {"error": "SESSION_NOT_FOUND"})
        return _judge(winner, fp, key)

    async def events(request: Request) -> Response:
        try:
            session_id = uuid.UUID(request.path_params["session_id"])
            after = int(request.query_params.get("after", "0"))
            limit = int(request.query_params.get("limit", "100"))
        except ValueError:
            return _json(422, {"error": "INVALID_INPUT"})
        if not 0 <= limit <= 100 or after < 0:
            return _json(422, {"error": "INVALID_INPUT"})
        async with state["pool"].acquire() as conn:
            rows = await conn.fetch(EVENTS_AFTER, session_id, after, limit + 1)
        items = rows[:limit]
        return _json(
            200,
            {
                "events": [
                    {"seq": r["seq"], "type": r["type"], "data": orjson.Fragment(r["data"])}
                    for r in items
                ],
                "endCursor": items[-1]["seq"] if items else None,
                "hasNextPage": len(rows) > limit,
            },
        )

    return Starlette(
        routes=[
            Route("/sessions/{session_id}/turns", submit, methods=["POST"]),
            Route("/sessions/{session_id}/events", events, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
