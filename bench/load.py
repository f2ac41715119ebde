"""Load: the client that drives a throughput row (wrk, or the Python client
of bench/loadgen.py), the submissions it sends, how their answers are
classified, and the summary a row keeps."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import orjson

from bench import loadgen
from bench.rows import Measured, progress
from bench.sizes import BENCH, ROOT, Config

SUBMIT = (
    "mutation($i: SubmitTurnInput!) { submitTurn(input: $i) { __typename "
    "... on TurnAdmission { turn { id status } } ... on UserError { code } } }"
)


def choose_client(cfg: Config) -> str:
    found = shutil.which("wrk")
    if cfg.client == "wrk" and not found:
        raise SystemExit(
            "wrk not found: install it (apt-get install -y wrk) or use --client python"
        )
    if cfg.client == "auto":
        if found:
            return "wrk"
        if not cfg.smoke:
            raise SystemExit(
                "wrk not found: install it with `apt-get install -y wrk`, or run with "
                "BENCH_ARGS='--client python' (a Python client; its own CPU then skews the numbers)"
            )
        progress("wrk not found: using the built-in Python client (smoke run)")
        return "python"
    return cfg.client


def wrk_version() -> str:
    out = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout
    return out.splitlines()[0] if out else "wrk"


def _ms(us: float) -> float:
    return us / 1000.0


def run_wrk(cfg: Config, port: int, script: str, args: Sequence[str], duration: float) -> Measured:
    """One wrk thread, ``cfg.concurrency`` connections; the script prints its
    counts and latencies as the last JSON line."""
    cmd = [
        "wrk",
        "-t1",
        f"-c{cfg.concurrency}",
        f"-d{max(1, round(duration))}s",
        "--timeout",
        "10s",
        "-s",
        str(BENCH / script),
        f"http://127.0.0.1:{port}",
        "--",
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    line = [x for x in out.splitlines() if x.startswith("{")][-1]
    raw = json.loads(line)
    seconds = raw["duration_us"] / 1e6
    return {
        "requests": raw["requests"],
        "throughput": raw["requests"] / seconds,
        "p50_ms": _ms(raw["p50_us"]),
        "p99_ms": _ms(raw["p99_us"]),
        "max_ms": _ms(raw["max_us"]),
        "answers": {k: raw[k] for k in ("accepted", "replayed", "other", "errors") if k in raw},
    }


def submit_request(
    mode: str, sessions: Sequence[str], prefix: str, cycle: int
) -> loadgen.MakeRequest:
    """The n-th submission: a key from ``prefix`` and n (n cycling through
    1..``cycle`` when given, to replay), as bench/submit.lua makes them."""

    def make(n: int) -> loadgen.Request:
        if cycle:
            n = 1 + n % cycle  # as bench/submit.lua does
        sid = sessions[n % len(sessions)]
        key = f"{prefix}-1-{n}"
        text = f"hello {n}"
        if mode == "graphql":
            body = orjson.dumps(
                {
                    "query": SUBMIT,
                    "variables": {"i": {"sessionId": sid, "idempotencyKey": key, "input": text}},
                }
            )
            return ("POST", "/graphql", {"Content-Type": "application/json"}, body)
        headers = {"Content-Type": "application/json", "Idempotency-Key": key}
        return ("POST", f"/sessions/{sid}/turns", headers, orjson.dumps({"input": text}))

    return make


def classify(mode: str) -> loadgen.Classify:
    def judge(status: int, body: bytes) -> str:
        if mode == "graphql":
            if status == 200 and b'"TurnAccepted"' in body:
                return "accepted"
            if status == 200 and b'"TurnReplayed"' in body:
                return "replayed"
            return "other"
        return {202: "accepted", 200: "replayed"}.get(status, "other")

    return judge


def summarize(result: loadgen.Result) -> Measured:
    # Every kind of answer, counted even when none came (as submit.lua does).
    answers = {kind: 0 for kind in ("accepted", "replayed", "other")}
    answers.update(result.statuses)
    answers["errors"] = result.errors
    n = len(result.latencies_ms)
    return {
        "requests": n,
        "throughput": n / result.elapsed_s if result.elapsed_s else 0.0,
        "p50_ms": loadgen.percentile(result.latencies_ms, 50),
        "p99_ms": loadgen.percentile(result.latencies_ms, 99),
        "max_ms": max(result.latencies_ms, default=float("nan")),
        "answers": answers,
    }


def submit_load(
    cfg: Config,
    client: str,
    port: int,
    mode: str,
    sessions_file: Path,
    prefix: str,
    cycle: int,
    duration: float,
) -> Measured:
    """A closed-loop run of submissions: ``mode`` is ``graphql`` (Keyturn) or
    ``rest`` (the peer); ``cycle`` > 0 replays keys 1..cycle."""
    if client == "wrk":
        args = [mode, str(sessions_file), prefix, str(cycle)]
        return run_wrk(cfg, port, "submit.lua", args, duration)
    sessions = sessions_file.read_text().split()
    result = asyncio.run(
        loadgen.closed_loop(
            "127.0.0.1",
            port,
            submit_request(mode, sessions, prefix, cycle),
            classify(mode),
            concurrency=cfg.concurrency,
            duration_s=duration,
        )
    )
    return summarize(result)


def replay_cycle(cfg: Config, first: Measured) -> int:
    """Keys 1..N of the first run surely got their answer before it stopped."""
    return max(1, int(first["answers"].get("accepted", 0)) - cfg.concurrency)
