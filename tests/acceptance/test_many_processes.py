"""Several Keyturn processes on one PostgreSQL: every rule holds across them."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    ROOT,
    SESSION_EVENTS,
    TURN_COMPLETED,
    GraphQLClient,
    ServerProcess,
    admin,
    counts,
    npm,
    owner_process,
    request,
    start_server_process,
    stop_process,
    two_server_processes,
    ws_session,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def two_servers(database_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    # At INFO: a test reads the listener's reconnection from the log.
    with two_server_processes(database_url, tmp_path, env={"KEYTURN_LOG_LEVEL": "info"}) as servers:
        yield servers


async def test_completion_run_on_one_server_reaches_listeners_on_the_other(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = two_servers
    client = GraphQLClient(a.url)
    sid = await client.create_session()
    warm = (await client.submit(sid, "w", "warm up"))["turn"]
    await client.wait_for_status(warm["id"], {"COMPLETED"})  # seq 1..4
    turn = (await client.submit(sid, "k", "/sleep 1500 across processes"))["turn"]

    async def listen(server: ServerProcess) -> tuple[list[Any], list[Any]]:
        async with ws_session(server.ws_url) as ws:
            events: list[Any] = []

            async def stream() -> None:
                async for r in ws.subscribe(request(SESSION_EVENTS, s=sid, a=4)):
                    events.append(r["sessionEvents"])
                    if r["sessionEvents"]["type"] == "turn.completed":
                        return

            completed, _ = await asyncio.gather(
                asyncio.wait_for(_collect(ws.subscribe(request(TURN_COMPLETED, t=turn["id"]))), 30),
                asyncio.wait_for(stream(), 30),
            )
            return completed, events

    on_a, on_b = await asyncio.gather(listen(a), listen(b))
    done = await client.turn(turn["id"])
    assert done is not None
    other = b if owner_process(done, two_servers) is a else a
    completed, events = on_b if other is b else on_a
    assert [c["turnCompleted"]["status"] for c in completed] == ["COMPLETED"]
    assert [(e["seq"], e["type"]) for e in events] == [
        (5, "turn.started"),
        (6, "turn.running"),
        (7, "turn.delta"),
        (8, "turn.completed"),
    ]
    await client.close()


async def _collect(stream: Any) -> list[Any]:
    return [r async for r in stream]


async def test_sigkill_while_running_the_other_server_marks_it_interrupted(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = two_servers
    client = GraphQLClient(a.url)
    sid = await client.create_session()
    turn = (await client.submit(sid, "doomed", "/sleep 20000"))["turn"]
    nxt = (await client.submit(sid, "next", "after the crash"))["turn"]
    running = await client.wait_for_status(turn["id"], {"RUNNING"})
    victim = owner_process(running, two_servers)
    survivor = b if victim is a else a
    await client.close()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    killed_at = time.monotonic()

    client = GraphQLClient(survivor.url)
    interrupted = await client.wait_for_status(turn["id"], {"INTERRUPTED"}, within=20)
    # lease TTL 3 s + claim poll 0.2 s here; bound with room for a loaded machine
    assert time.monotonic() - killed_at < 3 + 5
    types = [e["type"] for e in interrupted["events"]]
    assert types.count("turn.started") == 1
    assert "turn.completed" not in types and types[-1] == "turn.interrupted"
    data = interrupted["events"][-1]["data"]
    assert data["owner"] == running["owner"] and data["epoch"] == running["epoch"]
    assert data["lastEvent"]["type"] == "turn.running"
    replay = await client.submit(sid, "doomed", "/sleep 20000")
    assert replay["__typename"] == "TurnReplayed"
    assert replay["turn"]["status"] == "INTERRUPTED"
    after = await client.wait_for_status(nxt["id"], {"COMPLETED"})
    assert "[interrupted]" in after["output"]
    await client.close()


CLIENT_SCRIPT = r"""
import asyncio, json, sys
import httpx
urls, sid, key, inputs, n = json.loads(sys.argv[1])
Q = ("mutation($i: SubmitTurnInput!) { submitTurn(input: $i) { __typename "
     "... on TurnAdmission { turn { id } } ... on IdempotencyConflict { existingTurnId } } }")
async def main():
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        async def one(i):
            body = {"query": Q, "variables": {"i": {"sessionId": sid, "idempotencyKey": key,
                                                    "input": inputs[i % len(inputs)]}}}
            try:
                r = await http.post(urls[i % len(urls)] + "/graphql", json=body)
                data = r.json()
                if r.status_code != 200 or data.get("errors"):
                    return {"error": r.text[:300]}
                return data["data"]["submitTurn"] | {"input": inputs[i % len(inputs)]}
            except Exception as e:
                return {"error": repr(e)}
        print(json.dumps(await asyncio.gather(*(one(i) for i in range(n)))))
asyncio.run(main())
"""


def run_clients(urls: list[str], sid: str, key: str, inputs: list[str]) -> list[dict[str, Any]]:
    """500 submissions from 4 client processes, each spreading over both servers."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CLIENT_SCRIPT,
                json.dumps([urls[p % 2 :] + urls[: p % 2], sid, key, inputs, 125]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(4)
    ]
    results: list[dict[str, Any]] = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        results += json.loads(out)
    return results


async def test_500_same_key_submissions_over_two_servers_make_one_turn(
    two_servers: tuple[ServerProcess, ServerProcess], database_url: str
) -> None:
    a, b = two_servers
    client = GraphQLClient(a.url)
    sid = await client.create_session()
    await client.close()
    results = await asyncio.to_thread(run_clients, [a.url, b.url], sid, "one-key", ["same"])
    assert [r for r in results if "error" in r] == []
    assert len(results) == 500
    ids = {r["turn"]["id"] for r in results}
    assert len(ids) == 1
    kinds = [r["__typename"] for r in results]
    assert kinds.count("TurnAccepted") == 1 and kinds.count("TurnReplayed") == 499
    conn = await admin(database_url)
    try:
        assert (await counts(conn, sid))[:2] == (1, 1)  # one turn, one turn.started
        assert await conn.fetchval("SELECT count(*) FROM turns") == 1
    finally:
        await conn.close()


async def test_500_same_key_two_inputs_over_two_servers_one_turn_losers_conflict(
    two_servers: tuple[ServerProcess, ServerProcess], database_url: str
) -> None:
    a, b = two_servers
    client = GraphQLClient(a.url)
    sid = await client.create_session()
    await client.close()
    results = await asyncio.to_thread(
        run_clients, [a.url, b.url], sid, "one-key", ["left", "right"]
    )
    assert [r for r in results if "error" in r] == []
    winner = next(r for r in results if r["__typename"] == "TurnAccepted")
    for r in results:
        if r["input"] == winner["input"]:
            assert r["__typename"] in {"TurnAccepted", "TurnReplayed"}
            assert r["turn"]["id"] == winner["turn"]["id"]
        else:
            assert r["__typename"] == "IdempotencyConflict"
            assert r["existingTurnId"] == winner["turn"]["id"]
    conn = await admin(database_url)
    try:
        assert (await counts(conn, sid))[:2] == (1, 1)  # one turn, one turn.started
        assert await conn.fetchval("SELECT count(*) FROM turns") == 1
    finally:
        await conn.close()


async def test_listener_connection_terminated_while_turns_complete_loses_nothing(
    two_servers: tuple[ServerProcess, ServerProcess], database_url: str
) -> None:
    a, b = two_servers
    client = GraphQLClient(a.url)
    sid = await client.create_session()
    n_turns = 25
    received: list[dict[str, Any]] = []
    conn = await admin(database_url)
    terminated = 0
    try:
        async with ws_session(b.ws_url) as ws:

            async def listen() -> None:
                async for r in ws.subscribe(request(SESSION_EVENTS, s=sid, a=0)):
                    received.append(r["sessionEvents"])
                    if sum(e["type"] == "turn.completed" for e in received) == n_turns:
                        return

            task = asyncio.create_task(listen())
            for n in range(n_turns):
                await client.submit(sid, f"k{n}", f"/sleep 40 turn {n}")
                if n % 5 == 2:
                    terminated += await conn.fetchval(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = $1",
                        f"keyturn-listener:{b.proc.pid}",
                    )
            await asyncio.wait_for(task, 60)
    finally:
        await conn.close()
    assert terminated >= 3
    seqs = [e["seq"] for e in received]
    # started, running, delta, completed per turn: strictly increasing, no gap, no dup
    assert seqs == list(range(1, 4 * n_turns + 1))
    assert "listener reconnected" in b.log()
    await client.close()


async def test_sigterm_during_a_running_turn_lets_it_finish(
    database_url: str, tmp_path: Path
) -> None:
    a = start_server_process(
        database_url, tmp_path, name="a", env={"KEYTURN_SHUTDOWN_GRACE_S": "15"}
    )
    b = start_server_process(database_url, tmp_path, name="b")
    try:
        client = GraphQLClient(a.url)
        sid = await client.create_session()
        turn = (await client.submit(sid, "k", "/sleep 2500 finish me"))["turn"]
        queued = (await client.submit(sid, "q", "queued behind it"))["turn"]
        running = await client.wait_for_status(turn["id"], {"RUNNING"})
        owner = owner_process(running, (a, b))
        await client.close()
        owner.proc.send_signal(signal.SIGTERM)
        other = b if owner is a else a
        client = GraphQLClient(other.url)
        done = await client.wait_for_status(turn["id"], {"COMPLETED", "INTERRUPTED"}, within=30)
        assert done["status"] == "COMPLETED"
        assert done["owner"] == running["owner"]  # finished by the process that started it
        after = await client.wait_for_status(queued["id"], {"COMPLETED"}, within=30)
        assert after["status"] == "COMPLETED"
        owner.proc.wait(30)
        assert "INTERRUPTED" not in {
            t["node"]["status"] for t in (await client.session(sid))["turns"]["edges"]
        }
        await client.close()
    finally:
        stop_process(a)
        stop_process(b)


async def test_serve_with_workers_runs_that_many_processes_on_one_port(
    database_url: str, tmp_path: Path
) -> None:
    server = start_server_process(database_url, tmp_path, workers=2)
    conn = await admin(database_url)
    try:
        names: list[str] = []
        for _ in range(100):
            names = [
                r["application_name"]
                for r in await conn.fetch(
                    "SELECT application_name FROM pg_stat_activity "
                    "WHERE application_name LIKE 'keyturn-listener:%'"
                )
            ]
            if len(names) == 2:
                break
            await asyncio.sleep(0.1)
        assert len(set(names)) == 2  # two processes, each with its own listener
        client = GraphQLClient(server.url)
        sid = await client.create_session()
        t = (await client.submit(sid, "k", "hi"))["turn"]
        assert (await client.wait_for_status(t["id"], {"COMPLETED"}))["status"] == "COMPLETED"
        await client.close()
    finally:
        await conn.close()
        stop_process(server)


NODE_DIR = ROOT / "tests" / "node"


@pytest.fixture(scope="session")
def node_client() -> Path:
    npm.installed(NODE_DIR, ["graphql-ws"], "the graphql-ws client test")
    return NODE_DIR / "turn_completed.mjs"


async def test_other_peoples_clients_receive_turn_completed_from_another_server(
    two_servers: tuple[ServerProcess, ServerProcess], node_client: Path
) -> None:
    a, b = two_servers
    client = GraphQLClient(a.url)
    sid = await client.create_session()
    turn = (await client.submit(sid, "k", "/sleep 2000 for the other clients"))["turn"]
    running = await client.wait_for_status(turn["id"], {"RUNNING"})
    other = b if owner_process(running, two_servers) is a else a

    node = await asyncio.create_subprocess_exec(
        "node",
        str(node_client),
        other.ws_url,
        turn["id"],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )

    async def with_gql() -> list[Any]:
        async with ws_session(other.ws_url) as ws:
            return await _collect(ws.subscribe(request(TURN_COMPLETED, t=turn["id"])))

    from_gql = await asyncio.wait_for(with_gql(), 30)
    out, err = await asyncio.wait_for(node.communicate(), 30)
    assert node.returncode == 0, err.decode()
    from_node = json.loads(out)
    assert [r["data"]["turnCompleted"]["status"] for r in from_node] == ["COMPLETED"]
    assert from_node[0]["data"]["turnCompleted"]["owner"] == running["owner"]
    assert [r["turnCompleted"]["status"] for r in from_gql] == ["COMPLETED"]
    await client.close()
