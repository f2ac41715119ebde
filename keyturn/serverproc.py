"""``keyturn serve`` as a child process: what the experiment command (and the
test suite) use to run real servers they can stop or kill."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    """Start ``keyturn serve`` on a free port and wait for ``/healthz``.

    The child sees none of this process's Keyturn settings, only ``env`` (and
    the database URL when one is given; without one it uses the embedded
    PostgreSQL under ``workdir``)."""
    port = free_port()
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith("KEYTURN_") and k != "DATABASE_URL"
    }
    if database_url is not None:
        full_env["KEYTURN_DATABASE_URL"] = database_url
    full_env.update(env or {})
    log_path = workdir / f"{name}-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keyturn",
                "serve",
                "--port",
                str(port),
                "--workers",
                str(workers),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=workdir,
        )
    server = ServerProcess(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerFailed(f"server exited early:\n{server.log()}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(server.url + "/healthz", timeout=1) as answer,
        ):
            if answer.status == 200:
                return server
        time.sleep(0.1)
    server.stop()
    raise ServerFailed(f"server not healthy in {timeout}s:\n{server.log()}")
