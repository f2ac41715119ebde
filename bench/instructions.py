"""Instructions one request costs a Keyturn process, counted by callgrind:
the same count, to a part in a thousand, however busy the machine is.

    python -m bench.instructions page     # a page of 100 events (row f's document)
    python -m bench.instructions replay   # submitTurn, a key already admitted (row d)
    python -m bench.instructions new      # submitTurn, a new key, and its turn run (row c)

``make bench``'s ratios and ``bench.cpu``'s CPU times move by a fifth from
one run to the next on a shared machine, more than most single changes
save. This counts what a change does to the process's own work instead:
the application (``keyturn.http.app.create_app``, its runtime and worker
included) runs in this process against a real PostgreSQL and is called
through ASGI by 8 concurrent clients, without a socket; after a warm-up,
valgrind's callgrind counts the user-space instructions of ``--requests``
requests (for ``new``, until every turn they admitted has ended), divided
by their number. Not counted: PostgreSQL's work, the kernel's (system
calls, sockets) and uvicorn's HTTP parsing. A run takes a minute or two;
compare two versions of the code by running this on each.

Needs valgrind (``apt-get install -y valgrind``)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import reading
from bench.admission import drained
from bench.load import submit_request
from bench.loadgen import MakeRequest, Request
from bench.rows import progress
from bench.seed import make_event_session, make_sessions
from bench.servers import database_server, target_databases

EVENTS = 10_000
CLIENTS = 8
# Keys replayed by `replay`, admitted (and their turns run) first.
REPLAYED = 256
# How long the worker may take to run the turns admitted.
DRAIN_S = 600.0
# Set in the process valgrind runs: what to count, against which database,
# and where valgrind's command pipes for this run are.
_CHILD = "KEYTURN_BENCH_INSTRUCTIONS"
_PIPES = "KEYTURN_BENCH_INSTRUCTIONS_PIPES"


async def _call(app: Any, request: Request) -> tuple[int, bytes]:
    """One request through the application's ASGI interface."""
    method, path, headers, body = request
    received = False
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect while the answer is made
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [*raw, (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return status, body


async def _turns_run(url: str) -> None:
    """Until every turn admitted has ended: the worker's share counted."""
    if (await drained(url, DRAIN_S))["left"]:
        raise SystemExit(f"the worker left turns queued or running after {DRAIN_S:.0f} s")


async def _callgrind(switch: str) -> None:
    """Instrumentation on or off, asked of valgrind through vgdb (what
    callgrind_control calls, without its listing of every valgrind on the
    machine), on this run's own pipes. Valgrind takes the request while
    this process runs code, so the loop keeps running some until it is
    done; the few turns it takes are all it adds to a count. A request not
    taken in 20 s is asked again, twice; then the run ends at once, with
    no shutdown that could wait too."""
    for _ in range(3):
        control = await asyncio.create_subprocess_exec(
            "vgdb",
            f"--vgdb-prefix={os.environ[_PIPES]}",
            f"--pid={os.getpid()}",
            "instrumentation",
            switch,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while control.returncode is None and time.monotonic() < deadline:  # noqa: ASYNC110 - code must run meanwhile
            await asyncio.sleep(0.005)
        if control.returncode is not None:
            return
        control.kill()
        await control.wait()
    print(f"vgdb: instrumentation {switch} was not answered", file=sys.stderr, flush=True)
    os._exit(3)


async def _measure(what: str, url: str, requests: int) -> None:
    """In the process valgrind runs: the application, a warm-up, then the
    counted requests between callgrind's instrumentation on and off."""
    from keyturn.http.app import create_app
    from keyturn.settings import Settings

    make: MakeRequest
    if what == "page":
        session = await make_event_session(url, EVENTS, "NONE")
        pages = reading.page_requests("graphql", session, EVENTS)
        make, expect = (lambda n: pages[n % len(pages)]), b'"edges"'
    else:
        sessions = await make_sessions(url, 64, "NONE")
        # bench/submit.lua's requests: new keys, or keys 1..REPLAYED again.
        cycle = REPLAYED if what == "replay" else 0
        make = submit_request("graphql", sessions, what, cycle)
        expect = b'"TurnReplayed"' if what == "replay" else b'"TurnAccepted"'
    app = create_app(Settings(), database_url=url)
    async with app.router.lifespan_context(app):
        numbers = itertools.count()
        if what == "replay":
            for n in range(REPLAYED):
                await _call(app, make(n))
            await _turns_run(url)

        async def client(count: int) -> None:
            for _ in range(count):
                status, body = await _call(app, make(next(numbers)))
                if status != 200 or expect not in body:
                    raise SystemExit(f"an unexpected answer: {status} {body[:300]!r}")

        await asyncio.gather(*(client(10) for _ in range(CLIENTS)))  # warm-up
        if what == "new":
            await _turns_run(url)
        await _callgrind("on")
        await asyncio.gather(*(client(requests // CLIENTS) for _ in range(CLIENTS)))
        if what == "new":
            await _turns_run(url)
        await _callgrind("off")


def _child() -> int:
    import uvloop

    what, url, requests = os.environ[_CHILD].split(" ")
    uvloop.run(_measure(what, url, int(requests)))
    return 0


def main(argv: list[str] | None = None) -> int:
    if os.environ.get(_CHILD):
        return _child()
    p = argparse.ArgumentParser(
        prog="bench.instructions", description="instructions per request, counted by callgrind"
    )
    p.add_argument("what", choices=("page", "replay", "new"))
    p.add_argument("--requests", type=int, default=200, help="requests counted (8 clients)")
    p.add_argument("--database", default="auto", help="auto, embedded or a server URL")
    p.add_argument(
        "--keep", type=Path, help="keep callgrind's file here (callgrind_annotate reads it)"
    )
    a = p.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("vgdb") is None:
        raise SystemExit("bench.instructions needs valgrind: apt-get install -y valgrind")
    requests = max(CLIENTS, a.requests // CLIENTS * CLIENTS)
    with (
        database_server(a.database) as (admin_url, where),
        target_databases(admin_url, ("keyturn",)) as urls,
        tempfile.TemporaryDirectory(prefix="keyturn-instructions-") as tmp,
    ):
        progress(f"{where}; {a.what}: {requests} requests under callgrind (a minute or two)")
        out = a.keep or Path(tmp) / "callgrind.out"
        env = {
            **os.environ,
            _CHILD: f"{a.what} {urls['keyturn']} {requests}",
            _PIPES: str(Path(tmp) / "vgdb"),
            # The same hashes every run: a dict's layout, and so its work, alike.
            "PYTHONHASHSEED": "0",
        }
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--vgdb-prefix={Path(tmp) / 'vgdb'}",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "bench.instructions",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=900,  # killed, not left behind, if it never ends
        )
        counted = [line for line in done.stderr.splitlines() if "Collected :" in line]
        if done.returncode != 0 or not counted:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise SystemExit(f"the counted run failed:\n{tail}")
        total = int(counted[-1].split(":")[-1])
        print(f"keyturn {a.what}: {total / requests / 1e6:.3f} M instructions per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
