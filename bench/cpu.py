"""The CPU one request costs a server process, under wrk: for comparing a
change with the code before it (run this on each and compare), where
``make bench``'s throughput ratios move with the machine from one run to
the next.

    python -m bench.cpu page      # Keyturn: pages of 100 events (bench/cycle.lua)
    python -m bench.cpu replay    # Keyturn: submitTurn, keys already admitted
    python -m bench.cpu new       # Keyturn: submitTurn, new keys, and their turns run
    python -m bench.cpu page --peer

One server process (``--workers 1``, or as many as ``--workers`` says), its
CPU (user + system, from the kernel's accounting of the process and its
children) divided by the requests wrk completed, for each of ``--rounds``
rounds (for ``new``, a round ends when every turn it admitted has ended);
beside it the CPU of the PostgreSQL backends serving its database (when the
database runs on this machine), which the statements a request sends cost
there, the client's (wrk's) and the share of the machine's CPU time left
idle: what a throughput ratio of ``make bench`` is made of."""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
from pathlib import Path

import psutil

from bench import reading
from bench.admission import drain
from bench.load import choose_client, run_wrk
from bench.rows import Measured, progress
from bench.seed import make_event_session, make_sessions
from bench.servers import database_server, port_of, start_keyturn, start_peer, target_databases
from bench.sizes import Config, parse_args

EVENTS = 10_000
REPLAYED_KEYS = 2_000
DRAIN_S = 120.0


def _cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:  # a database backend that has gone
            continue
        total += times.user + times.system
    return total


def _system_calls(procs: list[psutil.Process]) -> tuple[int, int]:
    """(reads, writes): the read and write system calls the processes made
    so far, nearly all of them on sockets here (a round trip to PostgreSQL
    is at least one of each, a request's answer one write)."""
    reads = writes = 0
    for p in procs:
        try:
            io = p.io_counters()
        except psutil.NoSuchProcess:
            continue
        reads, writes = reads + io.read_count, writes + io.write_count
    return reads, writes


def _backend_seconds(database: str) -> dict[int, float]:
    """The CPU seconds so far of each backend serving ``database``, by pid.
    Read at a round's start and end: a backend that opened during the round
    (a pool growing, the worker's connections under a backlog) is absent
    from the first reading and counts whole."""
    return {p.pid: _cpu_seconds([p]) for p in _backends(database)}


def _backends(database: str) -> list[psutil.Process]:
    """The PostgreSQL backends serving ``database`` on this machine (their
    process titles name it), for the database's share of a request."""
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        title = " ".join(p.info["cmdline"] or ())
        if p.info["name"] == "postgres" and f" {database} " in f"{title} ":
            found.append(p)
    return found


def _client_seconds() -> float:
    """CPU of this process's children that have ended: wrk's, once it has."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _idle_share() -> tuple[float, float]:
    """(idle, all) jiffies of the machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)  # idle + iowait


def _wrk(cfg: Config, port: int, script: str, args: list[str], seconds: float) -> Measured:
    measured = run_wrk(cfg, port, script, args, seconds)
    if measured["answers"].get("other") or measured["answers"].get("errors"):
        raise SystemExit(f"wrk: answers that were not the expected ones: {measured['answers']}")
    return measured


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.cpu", description="CPU per request, under wrk")
    p.add_argument("what", choices=("page", "replay", "new"))
    p.add_argument("--peer", action="store_true", help="the REST peer instead of Keyturn")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=8, help="seconds per round")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--workers", type=int, default=1, help="server processes")
    p.add_argument("--database", default="auto", help="auto, embedded or a server URL")
    a = p.parse_args(argv)
    cfg = parse_args(
        ["--workers", str(a.workers), "--concurrency", str(a.connections), "--database", a.database]
    )
    choose_client(cfg)
    mode = "rest" if a.peer else "graphql"
    target = "peer" if a.peer else "keyturn"
    with (
        database_server(cfg.database) as (admin_url, where),
        target_databases(admin_url, (target,)) as urls,
        tempfile.TemporaryDirectory(prefix="keyturn-cpu-") as tmp_dir,
    ):
        tmp, url = Path(tmp_dir), urls[target]
        progress(f"{where}; seeding")
        if a.what == "page":
            sid = asyncio.run(make_event_session(url, EVENTS, cfg.history))
            lines = [
                f"{method}\t{path}\t{body.decode()}"
                for method, path, _, body in reading.page_requests(mode, sid, EVENTS)
            ]
            (tmp / "pages.txt").write_text("\n".join(lines) + "\n")
            script, args = "cycle.lua", [str(tmp / "pages.txt")]
        else:
            sessions = asyncio.run(make_sessions(url, cfg.sessions, cfg.history))
            (tmp / "sessions.txt").write_text("\n".join(sessions) + "\n")
            script, args = "submit.lua", [mode, str(tmp / "sessions.txt"), "cpu", "0"]
        if a.peer:
            server = start_peer(cfg, url, tmp)
        else:
            server, _ = start_keyturn(cfg, url, tmp)
        try:
            port = port_of(server)
            parent = psutil.Process(server.proc.pid)
            procs = [parent, *parent.children(recursive=True)]
            if a.what == "replay":
                # Keys admitted first, then only those replayed (keys 1..N;
                # the last few sent may not have been answered).
                admitted = _wrk(cfg, port, script, args, 3)["requests"] // 2
                args = [*args[:3], str(min(REPLAYED_KEYS, admitted))]
            per: list[float] = []
            database = url.rsplit("/", 1)[-1].split("?")[0]
            in_database: list[float] = []
            for n in range(a.rounds):
                before, before_db = _cpu_seconds(procs), _backend_seconds(database)
                calls_before = _system_calls(procs)
                before_client, (idle0, all0) = _client_seconds(), _idle_share()
                measured = _wrk(cfg, port, script, args, a.duration)
                if a.what == "new" and not a.peer:
                    # The round's turns run to their end before the CPU is
                    # read: without it a round that admitted faster than the
                    # worker ran would be charged less than its turns cost.
                    drain(url, DRAIN_S)
                done = measured["requests"]
                client = (_client_seconds() - before_client) / done * 1000
                idle1, all1 = _idle_share()
                idle = (idle1 - idle0) / max(1.0, all1 - all0)
                if a.what == "replay" and measured["answers"].get("accepted"):
                    raise SystemExit(f"a replay admitted a new turn: {measured['answers']}")
                if a.what == "new":
                    args = [*args[:2], f"cpu{n + 1}", "0"]  # keys of its own each round
                per.append((_cpu_seconds(procs) - before) / done * 1000)
                calls = [
                    (a - b) / done for a, b in zip(_system_calls(procs), calls_before, strict=True)
                ]
                after_db = _backend_seconds(database)
                used_db = sum(t - before_db.get(pid, 0.0) for pid, t in after_db.items())
                in_database.append(used_db / done * 1000)
                progress(
                    f"{target} {a.what}: {done} requests, {per[-1]:.3f} ms of CPU each"
                    f" (and {in_database[-1]:.3f} ms in the database, {client:.3f} ms"
                    f" in the client; {idle:.0%} of the machine idle;"
                    f" {calls[0]:.1f} reads and {calls[1]:.1f} writes per request)"
                )
        finally:
            server.stop()
        per.sort()
        in_database.sort()
        print(
            f"{target} {a.what}: median {per[len(per) // 2]:.3f} ms of CPU per request,"
            f" {in_database[len(in_database) // 2]:.3f} ms in the database"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
