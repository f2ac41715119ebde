"""A server started as a child process is the one that answers: a port
another process took between its choice and the child's bind is not taken
for the child being up (the child starts again on another port)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from keyturn.ops import serverproc
from tests.support import start_server_process, stop_process

pytestmark = pytest.mark.slow


class _Stranger(http.server.BaseHTTPRequestHandler):
    """Another server's /healthz: 200, with an owner that is not the child."""

    def do_GET(self) -> None:
        body = json.dumps({"status": "ok", "owner": "elsewhere:1:0"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def stranger() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stranger)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_a_port_taken_by_another_server_is_not_the_child_being_up(
    database_url: str, tmp_path: Path, stranger: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([stranger])
    real = serverproc.free_port
    monkeypatch.setattr(serverproc, "free_port", lambda: next(ports, None) or real())
    server = start_server_process(database_url, tmp_path)
    try:
        assert not server.url.endswith(f":{stranger}")
        body = serverproc._answer(server, "/healthz")
        assert body is not None
        assert serverproc.served_by(body, server.proc)
        # The first try lost its port, and said so.
        first = tmp_path / f"server-{stranger}.log"
        assert f"port {stranger} on 127.0.0.1 is taken by another program" in first.read_text()
    finally:
        stop_process(server)
