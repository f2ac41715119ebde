"""A short soak: steady mixed traffic on two real processes over one
database, then an account of every acknowledgement. The figures (turns
acknowledged, turns missing) are printed at the end of the run.

``KEYTURN_SOAK_S`` sets how long it runs (default 20 s).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import figures
from tests.support import (
    MUTATION_SUBMIT,
    GraphQLClient,
    admin,
    new_key,
    start_server_process,
    stop_process,
)

pytestmark = pytest.mark.slow

SESSIONS = 8
CLIENTS = 16
PAGE = "query($id: ID!) { session(id: $id) { events(first: 50) { totalCount } } }"


async def submit(http: httpx.AsyncClient, sid: str, key: str, text: str) -> dict[str, Any] | None:
    variables = {"input": {"sessionId": sid, "idempotencyKey": key, "input": text}}
    try:
        response = await http.post(
            "/graphql", json={"query": MUTATION_SUBMIT, "variables": variables}
        )
    except httpx.TransportError:
        return None  # unanswered: the same key is sent again
    body = response.json()
    if body.get("errors"):
        assert body["errors"][0]["extensions"].get("retryable"), body
        return None
    result: dict[str, Any] = body["data"]["submitTurn"]
    assert result["__typename"] in ("TurnAccepted", "TurnReplayed"), result
    return result


async def read_page(http: httpx.AsyncClient, sid: str) -> httpx.Response:
    """A page, read again once if its connection was dropped before an answer:
    a kept-alive connection the server closes (uvicorn, after 5 s idle) just
    as the client reuses it answers nothing, and a client reads again."""
    body = {"query": PAGE, "variables": {"id": sid}}
    try:
        return await http.post("/graphql", json=body)
    except httpx.TransportError:
        figures.add("soak reads sent again after a dropped connection")
        return await http.post("/graphql", json=body)


async def test_a_soak_on_two_processes_loses_no_acknowledged_turn(
    database_url: str, tmp_path: Path
) -> None:
    duration = float(os.environ.get("KEYTURN_SOAK_S", "20"))
    servers = [start_server_process(database_url, tmp_path, name=f"soak-{n}") for n in (1, 2)]
    acked: dict[tuple[str, str], str] = {}  # (session, key) -> turn id
    try:
        setup = GraphQLClient(servers[0].url)
        sessions = [await setup.create_session() for _ in range(SESSIONS)]
        await setup.close()
        https = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in servers]
        deadline = time.monotonic() + duration

        async def client(n: int) -> None:
            rng = random.Random(n)
            while time.monotonic() < deadline:
                http = https[rng.randrange(2)]
                sid = rng.choice(sessions)
                roll = rng.random()
                if roll < 0.2 and acked:
                    # A retry of an acknowledged turn: the same turn, from either process.
                    (old_sid, key), turn_id = rng.choice(list(acked.items()))
                    again = await submit(http, old_sid, key, f"soak {key}")
                    if again is not None:
                        assert again["__typename"] == "TurnReplayed", again
                        assert again["turn"]["id"] == turn_id
                elif roll < 0.3:
                    page = await read_page(http, sid)
                    assert page.status_code == 200, page.text
                else:
                    key = new_key()
                    for _attempt in range(200):
                        result = await submit(http, sid, key, f"soak {key}")
                        if result is not None:
                            acked[(sid, key)] = result["turn"]["id"]
                            break
                        await asyncio.sleep(0.05)  # then the same key again
                    else:
                        raise AssertionError(f"{key} was never acknowledged")

        await asyncio.gather(*(client(n) for n in range(CLIENTS)))
        for http in https:
            await http.aclose()

        db: Any = await admin(database_url)
        try:
            wait_until = time.monotonic() + 60
            while await db.fetchval(
                "SELECT count(*) FROM turns WHERE status IN ('QUEUED', 'RUNNING')"
            ):
                assert time.monotonic() < wait_until, "turns still queued after the soak"
                await asyncio.sleep(0.2)
            rows = await db.fetch("SELECT id::text AS id, status FROM turns")
            gaps = await db.fetchval(
                """SELECT count(*) FROM (
                       SELECT session_id, max(seq) - count(*) AS gap FROM events GROUP BY session_id
                   ) g WHERE gap <> 0"""
            )
        finally:
            await db.close()
    finally:
        for server in servers:
            stop_process(server)

    statuses = {r["id"]: r["status"] for r in rows}
    missing = [turn for turn in acked.values() if turn not in statuses]
    figures.add("soak turns acknowledged", len(acked))
    figures.add("soak turns missing", len(missing))
    assert missing == []
    assert len(statuses) == len(acked)  # no turn nobody acknowledged
    assert set(statuses.values()) == {"COMPLETED"}
    assert gaps == 0
