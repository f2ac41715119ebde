"""Row e: ``turnCompleted`` fan-out. Listeners (graphql-transport-ws, one
connection each) on a few running turns, spread over Keyturn's worker
processes; latency from the ``turn.completed`` event's ``created_at`` (its
transaction's start) to each client's receipt on the same clock, and the
workers' RSS before connecting, after connecting and with every subscription
idle."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import TypedDict

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.typing import Subprotocol

from bench import loadgen
from bench.load import SUBMIT
from bench.rows import Row, progress, show
from bench.seed import make_sessions
from bench.sizes import Config
from keyturn.ops.databases import admin_connect

COMPLETED_SUB = "subscription($t: ID!) { turnCompleted(turnId: $t) { id status } }"


class Fanout(TypedDict):
    listeners: int
    turns: int
    processes: int
    delivered: int
    late_subscribers: int
    delivered_before_end: int
    missing: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    connect_s: float
    rss_kib_before: dict[int, int]
    rss_kib_connected: dict[int, int]
    rss_kib_subscribed: dict[int, int]
    kib_per_connection: float
    kib_per_subscription_only: float
    kib_per_idle_subscription: float


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _open(ws_url: str) -> ClientConnection:
    ws = await ws_connect(ws_url, subprotocols=[Subprotocol("graphql-transport-ws")], max_queue=4)
    await ws.send('{"type":"connection_init","payload":{}}')
    ack = json.loads(await ws.recv())
    assert ack["type"] == "connection_ack", ack
    return ws


async def _submit_sleepers(port: int, sessions: list[str], sleep_ms: int) -> list[str]:
    """One turn per session, each sleeping long enough for every listener to
    subscribe while it runs; their ids."""
    http = loadgen.Connection("127.0.0.1", port)
    turn_ids: list[str] = []
    for n, sid in enumerate(sessions):
        body = orjson.dumps(
            {
                "query": SUBMIT,
                "variables": {
                    "i": {
                        "sessionId": sid,
                        "idempotencyKey": f"fanout-{n}",
                        "input": f"/sleep {sleep_ms}",
                    }
                },
            }
        )
        _status, payload = await http.request(
            ("POST", "/graphql", {"Content-Type": "application/json"}, body)
        )
        turn_ids.append(orjson.loads(payload)["data"]["submitTurn"]["turn"]["id"])
    http.close()
    return turn_ids


async def _completed_at(db_url: str, turn_ids: list[str]) -> dict[str, float]:
    conn = await admin_connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT turn_id::text AS t, extract(epoch FROM created_at)::float8 AS at "
            "FROM events WHERE turn_id = ANY($1::uuid[]) AND type = 'turn.completed'",
            turn_ids,
        )
    finally:
        await conn.close()
    return {str(r["t"]): float(r["at"]) for r in rows}


async def fanout(cfg: Config, port: int, pids: list[int], db_url: str, history: str) -> Fanout:
    ws_url = f"ws://127.0.0.1:{port}/graphql"
    sessions = await make_sessions(db_url, cfg.fanout_turns, history)
    base = {pid: rss_kib(pid) for pid in pids}

    conns: list[ClientConnection] = []
    started = time.perf_counter()
    batch = 50
    for i in range(0, cfg.listeners, batch):
        conns += await asyncio.gather(
            *(_open(ws_url) for _ in range(min(batch, cfg.listeners - i)))
        )
        if i and i % 250 == 0:
            progress(f"    {len(conns)} WebSocket connections open")
    connect_s = time.perf_counter() - started
    after_connect = {pid: rss_kib(pid) for pid in pids}

    turn_ids = await _submit_sleepers(port, sessions, cfg.fanout_sleep_ms)
    submitted = time.time()

    received: list[float | None] = [None] * len(conns)
    subscribed_at: list[float] = [0.0] * len(conns)

    async def listen(i: int, ws: ClientConnection) -> None:
        subscribed_at[i] = time.time()
        msg = {
            "id": "1",
            "type": "subscribe",
            "payload": {"query": COMPLETED_SUB, "variables": {"t": turn_ids[i % len(turn_ids)]}},
        }
        await ws.send(json.dumps(msg))
        while True:
            data = json.loads(await ws.recv())
            if data["type"] == "next":
                received[i] = time.time()
                assert data["payload"]["data"]["turnCompleted"]["status"] == "COMPLETED", data
            elif data["type"] in ("complete", "error"):
                return
            elif data["type"] == "ping":
                await ws.send('{"type":"pong"}')

    tasks = [asyncio.create_task(listen(i, ws)) for i, ws in enumerate(conns)]
    subscribe_s = time.time() - submitted
    await asyncio.sleep(1.0 if not cfg.smoke else 0.5)
    idle = {pid: rss_kib(pid) for pid in pids}
    early = sum(1 for r in received if r is not None)
    progress(f"    {len(conns)} listeners subscribed in {subscribe_s:.2f}s; waiting for the turns")
    _done, pending = await asyncio.wait(tasks, timeout=cfg.fanout_sleep_ms / 1000 + 30)
    for t in pending:
        t.cancel()
    for ws in conns:
        with contextlib.suppress(Exception):
            await ws.close()

    completed_at = await _completed_at(db_url, turn_ids)
    latencies: list[float] = []
    late = 0
    for i, got in enumerate(received):
        at = completed_at.get(turn_ids[i % len(turn_ids)])
        if got is None or at is None:
            continue
        if subscribed_at[i] >= at:
            late += 1  # subscribed after the end: answered at once, not a delivery
            continue
        latencies.append((got - at) * 1000)
    delta_connect = sum(after_connect[p] - base[p] for p in pids)
    delta_sub = sum(idle[p] - after_connect[p] for p in pids)
    n = max(1, len(conns))
    return {
        "listeners": len(conns),
        "turns": len(turn_ids),
        "processes": len(pids),
        "delivered": len(latencies),
        "late_subscribers": late,
        "delivered_before_end": early,
        "missing": sum(1 for r in received if r is None),
        "p50_ms": loadgen.percentile(latencies, 50),
        "p99_ms": loadgen.percentile(latencies, 99),
        "max_ms": max(latencies, default=float("nan")),
        "connect_s": connect_s,
        "rss_kib_before": base,
        "rss_kib_connected": after_connect,
        "rss_kib_subscribed": idle,
        "kib_per_connection": delta_connect / n,
        "kib_per_subscription_only": delta_sub / n,
        "kib_per_idle_subscription": (delta_connect + delta_sub) / n,
    }


def fanout_row(cfg: Config, port: int, pids: list[int], db_url: str) -> tuple[Row, Fanout]:
    progress(
        f"e fan-out: {cfg.listeners} turnCompleted listeners on "
        f"{cfg.fanout_turns} turns, {len(pids)} processes"
    )
    fan = asyncio.run(fanout(cfg, port, pids, db_url, cfg.history))
    row = Row(
        "e",
        f"turnCompleted fan-out, {fan['listeners']} listeners, "
        f"{fan['processes']} processes: commit → delivery; "
        f"{fan['kib_per_idle_subscription']:.1f} KiB per idle subscription",
        f"{fan['turns']} turns",
        None,
        fan["p50_ms"],
        fan["p99_ms"],
        dict(fan),
    )
    show(row)
    return row, fan
