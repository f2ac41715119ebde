"""Instructions one request costs a Keyturn process, counted by callgrind:
the same count, to within a part in a hundred, however busy the machine is.

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
import threading
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
# and the two pipes it asks the parent to switch the counting through
# ("<to the parent> <from the parent>", file descriptors).
_CHILD = "KEYTURN_BENCH_INSTRUCTIONS"
_SWITCH = "KEYTURN_BENCH_INSTRUCTIONS_SWITCH"
# How long one vgdb request may take, and how many are made, before a run
# that cannot switch is ended.
_VGDB_S = 20.0
_VGDB_TRIES = 3


# Requests answered so far in this process, for the watchdog.
_answered = [0]
# How long the requests may go without one answered before the run is
# ended, and how often that is checked. Valgrind makes a request some 50
# times slower; 90 s is still thousands of them.
STALL_S = 90.0
_STALL_CHECK_S = 5.0


async def _watchdog(draining: asyncio.Event) -> None:
    """A run whose requests stop being answered, or whose application does
    not shut down after them, is ended with what each of its tasks waits
    on, rather than waiting for the parent to kill it (a shutdown the
    listener's health check held up for ever was found so). Not while the
    worker's turns are awaited: that wait has a limit of its own."""
    seen, since = _answered[0], time.monotonic()
    while True:
        await asyncio.sleep(_STALL_CHECK_S)
        if draining.is_set() or _answered[0] != seen:
            seen, since = _answered[0], time.monotonic()
            continue
        if time.monotonic() - since < STALL_S:
            continue
        print(
            f"no request answered in {STALL_S:.0f} s; what each task waits on:",
            file=sys.stderr,
        )
        for task in asyncio.all_tasks():
            print(f"-- {task.get_name()}", file=sys.stderr)
            for line in _awaiting(task.get_coro()):
                print(f"   {line}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(4)


def _awaiting(coro: Any) -> list[str]:
    """Where a suspended coroutine is, down its chain of awaits (a task's
    own stack shows only the outermost frame), and what it last awaits."""
    lines: list[str] = []
    while coro is not None and len(lines) < 40:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            lines.append(f"awaits {coro!r}"[:300])
            break
        code = frame.f_code
        lines.append(f"{code.co_filename}:{frame.f_lineno} {code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return lines


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
    _answered[0] += 1
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return status, body


async def _turns_run(url: str, draining: asyncio.Event) -> None:
    """Until every turn admitted has ended: the worker's share counted."""
    draining.set()
    try:
        if (await drained(url, DRAIN_S))["left"]:
            raise SystemExit(f"the worker left turns queued or running after {DRAIN_S:.0f} s")
    finally:
        draining.clear()


async def _callgrind(switch: str) -> None:
    """Instrumentation on or off: asked of the parent (``_switcher``), which
    runs vgdb against this process. This process starts none of its own:
    each run that hung (about one in thirty) had started vgdb itself, and
    one was found idle in its loop, with no vgdb left running. Valgrind
    takes the request while this process runs code, so the loop keeps
    running some until the parent answers; the few turns it takes are all
    it adds to a count. A switch the parent could not make ends the run at
    once, with no shutdown that could wait too."""
    to_parent, from_parent = (int(fd) for fd in os.environ[_SWITCH].split())
    os.write(to_parent, f"{switch} {os.getpid()}\n".encode())
    answer = b""
    while not answer.endswith(b"\n"):
        await asyncio.sleep(0.005)
        try:
            answer += os.read(from_parent, 64)
        except BlockingIOError:
            continue
    if answer.strip() != b"ok":
        print(f"vgdb: instrumentation {switch} was not answered", file=sys.stderr, flush=True)
        os._exit(3)


def _switcher(asked: int, answered: int, prefix: str) -> None:
    """In the parent, on a thread: each line the counted process sends
    ("on PID", "off PID") run as vgdb's request on that process's own pipes
    (not callgrind_control, which first lists every valgrind on the
    machine), asked again if not taken within _VGDB_S; "ok" or "failed"
    back. Ends when the counted process does."""
    with open(asked, "rb", buffering=0) as lines, open(answered, "wb", buffering=0) as back:
        for line in lines:
            switch, pid = line.decode().split()
            ok = False
            for _ in range(_VGDB_TRIES):
                try:
                    ran = subprocess.run(
                        [
                            "vgdb",
                            f"--vgdb-prefix={prefix}",
                            f"--pid={pid}",
                            "instrumentation",
                            switch,
                        ],
                        capture_output=True,
                        timeout=_VGDB_S,
                        check=False,
                    )
                except subprocess.TimeoutExpired:
                    continue
                if ran.returncode == 0:
                    ok = True
                    break
            try:
                back.write(b"ok\n" if ok else b"failed\n")
            except BrokenPipeError:  # the counted process has ended
                return


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
    draining = asyncio.Event()
    watchdog = asyncio.create_task(_watchdog(draining), name="bench-watchdog")
    async with app.router.lifespan_context(app):
        numbers = itertools.count()
        if what == "replay":
            for n in range(REPLAYED):
                await _call(app, make(n))
            await _turns_run(url, draining)

        async def client(count: int) -> None:
            for _ in range(count):
                status, body = await _call(app, make(next(numbers)))
                if status != 200 or expect not in body:
                    raise SystemExit(f"an unexpected answer: {status} {body[:300]!r}")

        await asyncio.gather(*(client(10) for _ in range(CLIENTS)))  # warm-up
        if what == "new":
            await _turns_run(url, draining)
        await _callgrind("on")
        await asyncio.gather(*(client(requests // CLIENTS) for _ in range(CLIENTS)))
        if what == "new":
            await _turns_run(url, draining)
        await _callgrind("off")
    watchdog.cancel()


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
        prefix = str(Path(tmp) / "vgdb")
        asked, ask = os.pipe()  # (read, write): the child asks
        answer, answered = os.pipe()  # the parent answers
        os.set_blocking(answer, False)
        env = {
            **os.environ,
            _CHILD: f"{a.what} {urls['keyturn']} {requests}",
            _SWITCH: f"{ask} {answer}",
            # The same hashes every run: a dict's layout, and so its work, alike.
            "PYTHONHASHSEED": "0",
        }
        child = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--vgdb-prefix={prefix}",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "bench.instructions",
            ],
            env=env,
            pass_fds=(ask, answer),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The child's ends are its own now: the switcher sees the end of
        # its requests when the child exits.
        os.close(ask)
        os.close(answer)
        switcher = threading.Thread(target=_switcher, args=(asked, answered, prefix), daemon=True)
        switcher.start()
        try:
            stdout, stderr = child.communicate(timeout=900)
        except subprocess.TimeoutExpired:  # killed, not left behind, if it never ends
            child.kill()
            stdout, stderr = child.communicate()
        switcher.join(timeout=_VGDB_S * _VGDB_TRIES)
        done = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
        counted = [line for line in done.stderr.splitlines() if "Collected :" in line]
        if done.returncode != 0 or not counted:
            # Enough for the watchdog's report of every task.
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-200:])
            raise SystemExit(f"the counted run failed:\n{tail}")
        total = int(counted[-1].split(":")[-1])
        print(f"keyturn {a.what}: {total / requests / 1e6:.3f} M instructions per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
