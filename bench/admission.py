"""The admission rows: a (the floor), b and b' (the REST peer, new keys and
replays), c, d and c½ (Keyturn's submitTurn: new keys, replays, and an open
loop at half of c's throughput), and waiting for Keyturn's worker to run what
they admitted."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TypedDict

from bench import loadgen
from bench.load import classify, replay_cycle, submit_load, submit_request, summarize
from bench.profile import start_profile
from bench.rows import Measured, Row, progress, row_from, show
from bench.sizes import ROOT, Config
from keyturn.db.engine import asyncpg_dsn
from keyturn.ops.databases import admin_connect

SessionFiles = dict[tuple[str, str], Path]  # (target, scope) → a file of session ids


def scope_label(cfg: Config, scope: str) -> str:
    return {"many": f"{cfg.sessions} sessions", "hot": "1 hot session"}[scope]


def run_floor(cfg: Config, url: str, sessions_file: Path, prefix: str) -> Measured:
    cmd = [
        sys.executable,
        "-m",
        "bench.floor",
        "--dsn",
        asyncpg_dsn(url),
        "--sessions",
        str(sessions_file),
        "--history",
        cfg.history,
        "--duration",
        str(cfg.duration),
        "--concurrency",
        str(cfg.concurrency),
        "--pool",
        str(cfg.floor_pool),
        "--prefix",
        prefix,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    raw = json.loads(out.strip().splitlines()[-1])
    return {
        "requests": raw["requests"],
        "throughput": raw["throughput"],
        "p50_ms": raw["p50_ms"],
        "p99_ms": raw["p99_ms"],
        "answers": {"accepted": raw["accepted"], "other": raw["other"]},
    }


def floor_rows(cfg: Config, url: str, files: SessionFiles) -> list[Row]:
    rows = []
    for scope in ("many", "hot"):
        progress(f"a floor, {scope_label(cfg, scope)}: {cfg.duration:.0f}s")
        m = run_floor(cfg, url, files["floor", scope], f"floor-{scope}")
        row = row_from(
            f"a.{scope}", "floor: admission statement via asyncpg", scope_label(cfg, scope), m
        )
        show(row)
        rows.append(row)
    return rows


def peer_rows(cfg: Config, client: str, port: int, files: SessionFiles) -> list[Row]:
    """b and b' on both scopes, after a warm-up."""
    submit_load(cfg, client, port, "rest", files["peer", "many"], "warm", 0, cfg.warmup)
    rows = []
    for scope in ("many", "hot"):
        label = scope_label(cfg, scope)
        progress(f"b peer, new keys, {label}: {cfg.duration:.0f}s")
        pf = f"peer-{scope}"
        m = submit_load(cfg, client, port, "rest", files["peer", scope], pf, 0, cfg.duration)
        rows.append(row_from(f"b.{scope}", "REST peer, new keys", label, m))
        show(rows[-1])
        progress(f"b' peer, the same keys again, {label}")
        cycle = replay_cycle(cfg, m)
        m = submit_load(cfg, client, port, "rest", files["peer", scope], pf, cycle, cfg.duration)
        rows.append(row_from(f"b'.{scope}", "REST peer, replays", label, m, keys=cycle))
        show(rows[-1])
    return rows


class Drain(TypedDict):
    queued_at_end: int
    drain_s: float
    left: int


async def _unfinished(url: str) -> int:
    conn = await admin_connect(url)
    try:
        sql = "SELECT count(*) FROM turns WHERE status IN ('QUEUED', 'RUNNING')"
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


async def drained(url: str, limit_s: float) -> Drain:
    """Wait for Keyturn's worker to run what admission queued, at most ``limit_s``."""
    start = time.perf_counter()
    left = await _unfinished(url)
    first = left
    last_note = start
    while left and time.perf_counter() - start < limit_s:
        # Often enough that the wait counts the worker's time, not this poll's.
        await asyncio.sleep(0.05)
        left = await _unfinished(url)
        if time.perf_counter() - last_note > 3:
            progress(f"    worker draining: {left} turns still queued or running")
            last_note = time.perf_counter()
    return {"queued_at_end": first, "drain_s": time.perf_counter() - start, "left": left}


def drain(url: str, limit_s: float) -> Drain:
    """Wait for Keyturn's worker to run what admission queued; the row after starts clean."""
    return asyncio.run(drained(url, limit_s))


def keyturn_warmup(cfg: Config, client: str, port: int, url: str, files: SessionFiles) -> Drain:
    submit_load(cfg, client, port, "graphql", files["keyturn", "many"], "warm", 0, cfg.warmup)
    return drain(url, cfg.drain_timeout)


def keyturn_rows(
    cfg: Config,
    client: str,
    port: int,
    pids: list[int],
    url: str,
    files: SessionFiles,
    scope: str,
) -> list[Row]:
    """c and d on one scope; on the many sessions, c½ as well."""
    label = scope_label(cfg, scope)
    sessions_file = files["keyturn", scope]
    pf = f"kt-{scope}"
    progress(f"c submitTurn, new keys, {label}: {cfg.duration:.0f}s")
    spy = None
    if cfg.profile and scope == "many" and pids:
        spy = start_profile(pids[0], cfg.out / "profile-c.txt", cfg.duration)
    c = submit_load(cfg, client, port, "graphql", sessions_file, pf, 0, cfg.duration)
    if spy is not None:
        spy.wait(60)
    progress("    waiting for the worker to run the queued turns")
    dr = drain(url, cfg.drain_timeout)
    admitted = c["throughput"]
    if scope == "many":
        c = admitted_and_run(c, dr)
    rows = [
        row_from(
            f"c.{scope}", "Keyturn submitTurn, new keys", label, c, admitted_per_s=admitted, **dr
        )
    ]
    show(rows[-1])
    progress(f"    drain: {dr['queued_at_end']} queued -> {dr['left']} in {dr['drain_s']:.1f}s")
    progress(f"d submitTurn, the same keys again, {label}")
    cycle = replay_cycle(cfg, c)
    m = submit_load(cfg, client, port, "graphql", sessions_file, pf, cycle, cfg.duration)
    rows.append(row_from(f"d.{scope}", "Keyturn submitTurn, replays", label, m, keys=cycle))
    show(rows[-1])
    if scope == "many":
        rows.append(half_rate_row(cfg, port, url, sessions_file, c["throughput"]))
    return rows


def admitted_and_run(c: Measured, dr: Drain) -> Measured:
    """Row c on many sessions: new keys per second admitted *and run*, the
    row's requests over its time plus the worker's after it to run the turns
    still queued. Admission can outrun the worker (whose claims and
    finishes share the cores and the sessions' rows with it): in a row the
    worker ended 4,000 turns behind, and counting admissions alone would
    credit Keyturn with work done after the row. One hot session runs one
    turn at a time by design, so its backlog is not the worker's lag, and
    its row counts admissions (bench/README.md)."""
    if not c["throughput"]:
        return c
    seconds = c["requests"] / c["throughput"] + dr["drain_s"]
    return {**c, "throughput": c["requests"] / seconds}


def half_rate_row(cfg: Config, port: int, url: str, sessions_file: Path, peak: float) -> Row:
    """c½: latency at a fixed rate of half the closed loop's throughput
    (bench/loadgen.py: wrk cannot hold a rate), from each request's scheduled start."""
    rate = max(1.0, peak / 2)
    progress(f"c½ submitTurn, open loop at {rate:.0f}/s (half of c)")
    sessions = sessions_file.read_text().split()
    result = asyncio.run(
        loadgen.open_loop(
            "127.0.0.1",
            port,
            submit_request("graphql", sessions, "half", 0),
            classify("graphql"),
            rate=rate,
            duration_s=cfg.duration,
        )
    )
    row = row_from(
        "c½",
        f"Keyturn submitTurn, open loop at {rate:.0f}/s (latency)",
        scope_label(cfg, "many"),
        summarize(result),
        rate=rate,
    )
    show(row)
    drain(url, cfg.drain_timeout)
    return row
