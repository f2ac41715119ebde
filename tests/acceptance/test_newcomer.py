"""What someone trying Keyturn for the first time reads: the port, the
banner, the token message, the access log, --help, a command's output."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from keyturn.ops.serverproc import free_port, served_by, start_process
from tests.acceptance.clirun import clean_env, keyturn, one_clean_line
from tests.support import ROOT, start_server_process, stop_process

pytestmark = pytest.mark.slow


def test_make_serve_honours_keyturn_port(database_url: str, tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("needs make")
    port = free_port()
    env = clean_env(
        KEYTURN_PORT=str(port),
        KEYTURN_DATABASE_URL=database_url,
        KEYTURN_LOG_LEVEL="warning",
        VENV=str(Path(sys.executable).parent.parent),
    )
    # -o install: use the environment this suite runs in, install nothing.
    proc = subprocess.Popen(
        ["make", "-s", "-C", str(ROOT), "-o", "install", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            pytest.fail(f"make serve did not answer on KEYTURN_PORT={port}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    assert f"http://127.0.0.1:{port}/" in output, output


def test_a_taken_port_is_one_line_before_anything_claims_to_run(
    database_url: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for how in (["--port", str(port)], []):
            result = keyturn(
                "serve",
                *how,
                cwd=tmp_path,
                KEYTURN_DATABASE_URL=database_url,
                KEYTURN_PORT=str(port),
            )
            line = one_clean_line(result)
            assert f"port {port}" in line and "--port" in line and "KEYTURN_PORT" in line, line
            assert result.stdout == ""  # no banner, no OPEN notice


def test_token_create_says_every_request_now_needs_one(database_url: str, tmp_path: Path) -> None:
    created = keyturn(
        "token", "create", "--name", "first", cwd=tmp_path, KEYTURN_DATABASE_URL=database_url
    )
    assert created.returncode == 0, created.stderr
    said = " ".join(created.stderr.split())
    assert "every request" in said and "needs a token" in said
    assert "Revoking tokens does not reopen it" in said and "DELETE FROM api_tokens" in said
    # What it says is what happens: revoked, the server still wants a token.
    assert (
        keyturn(
            "token", "revoke", "first", cwd=tmp_path, KEYTURN_DATABASE_URL=database_url
        ).returncode
        == 0
    )
    server = start_server_process(database_url, tmp_path)
    try:
        answer = httpx.post(server.url + "/graphql", json={"query": "{ __typename }"}, timeout=10)
        assert answer.status_code == 401
    finally:
        stop_process(server)
    # A second token changes nothing: no second notice.
    again = keyturn(
        "token", "create", "--name", "second", cwd=tmp_path, KEYTURN_DATABASE_URL=database_url
    )
    assert "Revoking tokens" not in again.stderr


def test_wildcard_bind_banner_and_one_access_line_per_request(
    database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    server = start_process(
        [
            sys.executable,
            "-m",
            "keyturn",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--insecure-no-auth",
        ],
        tmp_path,
        port=port,
        env=clean_env(
            KEYTURN_DATABASE_URL=database_url,
            KEYTURN_LOG_FORMAT="json",
            KEYTURN_LOG_LEVEL="info",
        ),
        answered_by=served_by,
    )
    try:
        for i in range(3):
            httpx.post(
                server.url + "/graphql",
                json={"query": "{ __typename }"},
                headers={"x-request-id": f"probe-{i}"},
                timeout=10,
            )
        httpx.get(server.url + "/healthz", timeout=10)
    finally:
        stop_process(server)
    log = server.log()
    banner = next(line for line in log.splitlines() if line.startswith("Keyturn on"))
    assert f"http://127.0.0.1:{port}/" in banner
    assert f"http://{socket.gethostname()}:{port}/" in banner
    assert "http://0.0.0.0" not in banner
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    for i in range(3):
        lines = [r for r in records if f"probe-{i}" == r.get("request_id")]
        access = [r for r in lines if r["logger"] in ("keyturn.http.requestlog", "uvicorn.access")]
        assert len(access) == 1, lines
    assert not [r for r in records if r["logger"] == "uvicorn.access"]


def test_help_is_plain_text(tmp_path: Path) -> None:
    result = keyturn("--help", cwd=tmp_path)
    assert result.returncode == 0
    for markup in ("``", ":func:", ":mod:", ":class:"):
        assert markup not in result.stdout, result.stdout


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Outside pytest's private tree (see conftest.server_url).
    path = Path(tempfile.mkdtemp(prefix="keyturn-quiet-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_commands_do_not_log_the_embedded_database_serve_does(data_dir: Path) -> None:
    settings = {"KEYTURN_DATA_DIR": str(data_dir)}
    for command in (("db", "upgrade"), ("db", "current"), ("token", "list")):
        result = keyturn(*command, cwd=data_dir, KEYTURN_DATA_DIR=str(data_dir))
        assert result.returncode == 0, result.stderr
        assert result.stderr == "", (command, result.stderr)
    server = start_server_process(None, data_dir, env=settings | {"KEYTURN_LOG_LEVEL": "info"})
    stop_process(server)
    assert "embedded PostgreSQL running" in server.log()
