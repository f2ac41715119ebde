"""`keyturn token …` and the open-mode rule of `keyturn serve`, as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support import free_port, start_server_process, stop_process

pytestmark = pytest.mark.slow


def keyturn(
    database_url: str, cwd: Path, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYTURN_")}
    env["KEYTURN_DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "keyturn", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_token_create_list_revoke(database_url: str, tmp_path: Path) -> None:
    created = keyturn(database_url, tmp_path, "token", "create", "--name", "ci", "--tenant", "acme")
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("kt_") and len(secret) > 40
    assert "shown once" in created.stderr
    again = keyturn(database_url, tmp_path, "token", "create", "--name", "ci")
    assert again.returncode == 1 and "exists already" in again.stderr
    listed = keyturn(database_url, tmp_path, "token", "list")
    assert "ci" in listed.stdout and "acme" in listed.stdout and "active" in listed.stdout
    assert secret not in listed.stdout
    revoked = keyturn(database_url, tmp_path, "token", "revoke", "ci")
    assert revoked.returncode == 0
    assert "revoked" in keyturn(database_url, tmp_path, "token", "list").stdout
    assert keyturn(database_url, tmp_path, "token", "revoke", "ci").returncode == 1


def test_serve_refuses_to_run_open_off_loopback(database_url: str, tmp_path: Path) -> None:
    refused = keyturn(
        database_url, tmp_path, "serve", "--host", "0.0.0.0", "--port", str(free_port())
    )
    assert refused.returncode == 2
    assert "refusing to serve on 0.0.0.0 without API tokens" in refused.stderr


def test_serve_open_on_loopback_says_so_and_a_token_closes_it(
    database_url: str, tmp_path: Path
) -> None:
    server = start_server_process(database_url, tmp_path, env={"KEYTURN_AUTH_RECHECK_S": "0.3"})
    try:
        assert "OPEN: no API tokens exist" in server.log()
        query = {"query": "{ sessions { totalCount } }"}
        assert httpx.post(server.url + "/graphql", json=query).status_code == 200
        secret = keyturn(database_url, tmp_path, "token", "create", "--name", "me").stdout.strip()
        for _ in range(50):  # within the re-check period
            if httpx.post(server.url + "/graphql", json=query).status_code == 401:
                break
            time.sleep(0.1)
        assert httpx.post(server.url + "/graphql", json=query).status_code == 401
        authed = httpx.post(
            server.url + "/graphql", json=query, headers={"authorization": f"Bearer {secret}"}
        )
        assert authed.status_code == 200 and authed.json()["data"]["sessions"]["totalCount"] == 0
    finally:
        stop_process(server)


def test_insecure_no_auth_lets_it_run_open_anywhere(database_url: str, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYTURN_")}
    env["KEYTURN_DATABASE_URL"] = database_url
    proc = subprocess.Popen(
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
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for _ in range(200):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "OPEN" in out
