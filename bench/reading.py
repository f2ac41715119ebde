"""The reading rows, f (Keyturn) and f' (the peer): one session's events in
pages of 100. Latency from one reader following the cursors it is given;
throughput from ``cfg.concurrency`` readers cycling through every page."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import TypedDict

import orjson

from bench import loadgen
from bench.load import run_wrk, summarize
from bench.rows import Row, show
from bench.sizes import Config

PAGE_QUERY = (
    "query($id: ID!, $after: String) { session(id: $id) { events(first: 100, after: $after) "
    "{ edges { cursor node { seq type data } } pageInfo { endCursor hasNextPage } } } }"
)
JSON = {"Content-Type": "application/json"}


class Walk(TypedDict):
    pages: int
    events_per_pass: int
    p50_ms: float
    p99_ms: float


def keyturn_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"event:{seq}".encode()).decode().rstrip("=")


def _graphql_page(sid: str, after: str | None) -> loadgen.Request:
    body = orjson.dumps({"query": PAGE_QUERY, "variables": {"id": sid, "after": after}})
    return ("POST", "/graphql", JSON, body)


def _rest_page(sid: str, after: int) -> loadgen.Request:
    return ("GET", f"/sessions/{sid}/events?after={after}&limit=100", {}, b"")


def page_requests(kind: str, sid: str, events: int) -> list[loadgen.Request]:
    """Every page of the session, the cursors computed rather than followed."""
    out: list[loadgen.Request] = []
    for after in range(0, events, 100):
        if kind == "graphql":
            out.append(_graphql_page(sid, keyturn_cursor(after) if after else None))
        else:
            out.append(_rest_page(sid, after))
    return out


async def page_walk(port: int, kind: str, sid: str, passes: int) -> Walk:
    """One client reads the whole session page by page, following the cursors it is given."""
    conn = loadgen.Connection("127.0.0.1", port)
    latencies: list[float] = []
    seen = 0
    try:
        for _ in range(passes):
            cursor: str | None = None  # Keyturn's, opaque
            after = 0  # the peer's, a seq
            seen = 0
            while True:
                req = _graphql_page(sid, cursor) if kind == "graphql" else _rest_page(sid, after)
                start = time.perf_counter()
                status, payload = await conn.request(req)
                latencies.append((time.perf_counter() - start) * 1000)
                data = orjson.loads(payload)
                if status != 200 or "errors" in data:
                    raise RuntimeError(f"page read failed: {status} {payload[:300]!r}")
                if kind == "graphql":
                    page = data["data"]["session"]["events"]
                    seen += len(page["edges"])
                    cursor, more = page["pageInfo"]["endCursor"], page["pageInfo"]["hasNextPage"]
                else:
                    seen += len(data["events"])
                    after, more = data["endCursor"], data["hasNextPage"]
                if not more:
                    break
    finally:
        conn.close()
    return {
        "pages": len(latencies),
        "events_per_pass": seen,
        "p50_ms": loadgen.percentile(latencies, 50),
        "p99_ms": loadgen.percentile(latencies, 99),
    }


def reading_row(
    cfg: Config, client: str, port: int, kind: str, sid: str, tmp: Path, rid: str, who: str
) -> Row:
    """``kind`` is ``graphql`` (Keyturn) or ``rest`` (the peer); ``who`` names it in the label."""
    walk = asyncio.run(page_walk(port, kind, sid, cfg.walk_passes))
    if walk["events_per_pass"] != cfg.events:
        raise RuntimeError(f"{who} read {walk['events_per_pass']} events, expected {cfg.events}")
    reqs = page_requests(kind, sid, cfg.events)
    if client == "wrk":
        path = tmp / f"pages-{kind}.tsv"
        path.write_text(
            "".join(f"{m}\t{p}\t{b.decode()}\n" for m, p, _h, b in reqs), encoding="utf-8"
        )
        load = run_wrk(cfg, port, "cycle.lua", [str(path)], cfg.duration)
    else:
        result = asyncio.run(
            loadgen.closed_loop(
                "127.0.0.1",
                port,
                lambda n: reqs[n % len(reqs)],
                lambda s, b: "ok" if s == 200 and b'"errors"' not in b else "other",
                concurrency=cfg.concurrency,
                duration_s=cfg.duration,
            )
        )
        load = summarize(result)
    row = Row(
        rid,
        f"{who}: {cfg.events:,} events in pages of 100 (latency: one reader; "
        f"throughput: {cfg.concurrency} readers)",
        "1 session",
        load["throughput"],
        walk["p50_ms"],
        walk["p99_ms"],
        {"walk": walk, "under_load": load},
    )
    show(row)
    return row
