"""Mainstream GraphQL clients against a real Keyturn, unchanged: Apollo Client
(HTTP, multipart subscriptions, graphql-ws), urql and graphql-request, each
written as its own documentation shows (tests/node/*.mjs)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from keyturn.runtime.auth import create_token
from tests.support import ROOT, InProcessServer, fast_settings, npm, serve_in_process

pytestmark = pytest.mark.slow

NODE_DIR = ROOT / "tests" / "node"
PACKAGES = ("@apollo/client", "@urql/core", "graphql-request", "graphql-ws", "rxjs", "ws")


@pytest.fixture(scope="module")
def node_dir() -> Path:
    return npm.installed(NODE_DIR, (f"{p}/package.json" for p in PACKAGES), "the client tests")


@pytest.fixture
async def served(database_url: str) -> AsyncIterator[tuple[InProcessServer, str]]:
    # A token exists, so every client has to send it as Bearer.
    async with serve_in_process(database_url, fast_settings(auth_recheck_s=0.3)) as srv:
        token = await create_token(srv.app.state.runtime.engine, name="node")
        await asyncio.sleep(0.4)  # the "tokens exist" answer is cached this long
        yield srv, token


async def run_script(node_dir: Path, script: str, url: str, token: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(node_dir / script),
        url,
        cwd=node_dir,
        env={**os.environ, "KEYTURN_TOKEN": token},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    if proc.returncode != 0:
        pytest.fail(
            f"{script} exited {proc.returncode}\nstdout:\n{out.decode()}\nstderr:\n{err.decode()}"
        )
    return json.loads(out.decode().strip().splitlines()[-1])


async def test_apollo_client(
    node_dir: Path, served: tuple[InProcessServer, str], caplog: pytest.LogCaptureFixture
) -> None:
    server, token = served
    with caplog.at_level(logging.INFO, logger="keyturn.http.requestlog"):
        result = await run_script(node_dir, "apollo_client.mjs", server.url, token)
    # PersistedQueryLink: its first hash was unknown (404 PersistedQueryNotFound),
    # its second was not.
    statuses = [getattr(r, "status", None) for r in caplog.records]
    assert statuses.count(404) == 1, statuses
    assert result["replayed"] == "TurnReplayed"
    for way in ("overMultipart", "overWebSocket"):
        assert result[way]["turnCompleted"]["id"] == result["turnId"]
        assert result[way]["turnCompleted"]["status"] == "COMPLETED"


async def test_urql(node_dir: Path, served: tuple[InProcessServer, str]) -> None:
    server, token = served
    result = await run_script(node_dir, "urql_client.mjs", server.url, token)
    assert result["replayed"] == "TurnReplayed"
    assert result["completed"]["turnCompleted"]["id"] == result["turnId"]
    assert result["completed"]["turnCompleted"]["status"] == "COMPLETED"


async def test_graphql_request(
    node_dir: Path, served: tuple[InProcessServer, str], db: Any
) -> None:
    server, token = served
    result = await run_script(node_dir, "graphql_request.mjs", server.url, token)
    assert result["replayed"] == "TurnReplayed"
    [error] = result["mistake"]["errors"]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    # The mistake wrote nothing: one turn, from the accepted submission.
    assert await db.fetchval("SELECT count(*) FROM turns") == 1
