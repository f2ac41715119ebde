"""Servers as child processes: ``keyturn serve`` for the experiment command,
the test suite and the benchmark, and any other server the benchmark runs
beside it (its REST peer), each stopped or killed by whoever started it."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil


def free_port() -> int:
    """A port free now; another process may take it before the server
    binds it, which :func:`start_server` notices and survives."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bound_socket() -> socket.socket:
    """A socket bound to a free port of 127.0.0.1, for a server in this
    process to listen on (``uvicorn.Server.serve(sockets=[...])``): the port
    is held from the moment it is chosen, so no other process can take it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


# How a server that lost its port to another process says so: ``keyturn
# serve``'s own check before it starts, or uvicorn's bind after (a port taken
# between the two).
_PORT_TAKEN = ("is taken by another program", "address already in use")
_PORT_ATTEMPTS = 5


@dataclass
class ServerProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/graphql"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (a clean stop), SIGKILL if it has not ended in ``timeout``."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ServerFailed(RuntimeError):
    """The server exited or did not become healthy."""


def start_server(
    database_url: str | None,
    workdir: Path,
    *,
    env: Mapping[str, str] | None = None,
    workers: int = 1,
    name: str = "server",
    timeout: float = 60,
) -> ServerProcess:
    """Start ``keyturn serve`` on a free port and wait for ``/healthz`` to
    answer from it (not from another server that took the port meanwhile:
    then it starts again on another port).

    The child sees none of this process's Keyturn settings, only ``env`` (and
    the database URL when one is given; without one it uses the embedded
    PostgreSQL under ``workdir``)."""
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith("KEYTURN_") and k != "DATABASE_URL"
    }
    if database_url is not None:
        full_env["KEYTURN_DATABASE_URL"] = database_url
    full_env.update(env or {})
    attempts = _PORT_ATTEMPTS
    while True:
        port = free_port()
        argv = [sys.executable, "-m", "keyturn", "serve", "--port", str(port)]
        argv += ["--workers", str(workers)]
        try:
            return start_process(
                argv,
                workdir,
                port=port,
                env=full_env,
                name=name,
                timeout=timeout,
                answered_by=served_by,
            )
        except ServerFailed as failure:
            attempts -= 1
            if attempts == 0 or not any(said in str(failure) for said in _PORT_TAKEN):
                raise


def served_by(body: bytes, proc: subprocess.Popen[bytes]) -> bool:
    """Whether a ``/healthz`` answer comes from ``proc`` or one of its
    workers: its owner id is ``host:pid:nonce``."""
    try:
        pid = int(str(json.loads(body)["owner"]).split(":")[-2])
    except (ValueError, KeyError, IndexError, TypeError):
        return False
    if pid == proc.pid:
        return True
    try:
        return bool(psutil.Process(pid).ppid() == proc.pid)
    except psutil.Error:
        return False


def start_process(
    argv: Sequence[str],
    workdir: Path,
    *,
    port: int,
    env: Mapping[str, str],
    name: str = "server",
    health_path: str = "/healthz",
    timeout: float = 60,
    cwd: Path | None = None,
    answered_by: Callable[[bytes, subprocess.Popen[bytes]], bool] | None = None,
) -> ServerProcess:
    """Start ``argv``, a server that listens on 127.0.0.1:``port``, and wait
    until ``health_path`` answers 200 (and, with ``answered_by``, until that
    says the answer came from the child: a 200 from another process holding
    the port is not the child being up).

    The child gets exactly ``env``; its output goes to a log under ``workdir``,
    which is also where it runs unless ``cwd`` says otherwise."""
    log_path = workdir / f"{name}-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd or workdir,
        )
    server = ServerProcess(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerFailed(f"server exited early:\n{server.log()}")
        body = _answer(server, health_path)
        if body is not None and (answered_by is None or answered_by(body, proc)):
            return server
        time.sleep(0.1)
    server.stop()
    raise ServerFailed(f"server not healthy in {timeout}s:\n{server.log()}")


def worker_pids(server: ServerProcess, workers: int, *, timeout: float = 60) -> list[int]:
    """Wait until each of ``workers`` processes of a ``keyturn serve --workers``
    has answered ``/healthz``; their pids, in order.

    The first answer only says that one worker is up; a load started then
    would meet the others still starting. Each connection reaches whichever
    worker accepts it, and each names its owner id (``host:pid:nonce``)."""
    owners: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise ServerFailed(f"server exited early:\n{server.log()}")
        body = _answer(server, "/healthz")
        if body is not None:
            owners.add(str(json.loads(body)["owner"]))
            if len(owners) >= workers:
                return sorted(int(owner.split(":")[-2]) for owner in owners)
        time.sleep(0.05)
    raise ServerFailed(f"{len(owners)} of {workers} workers healthy in {timeout}s:\n{server.log()}")


def _answer(server: ServerProcess, path: str) -> bytes | None:
    """The body of a 200 answer on a new connection, or None."""
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(server.url + path, timeout=1) as answer,
    ):
        if answer.status == 200:
            body: bytes = answer.read()
            return body
    return None
