"""``keyturn doctor``: is this installation fit to serve?

One line per check, ``ok``, ``warn`` or ``fail``; the command exits 1 when any
check fails. Checks: the settings, the database (reachable, its version,
``synchronous_commit``), the migrations, and the clock skew between this
process and the database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from keyturn.settings import Settings

OK, WARN, FAIL = "ok", "warn", "fail"
MIN_SERVER_VERSION = 140000  # what the suite runs against or newer
SKEW_WARN_S = 1.0
SKEW_FAIL_S = 30.0


@dataclass(frozen=True)
class Check:
    status: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<4}  {self.name}: {self.detail}"


def check_settings() -> tuple[list[Check], Settings | None]:
    try:
        settings = Settings()
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        return [Check(FAIL, "settings", problems)], None
    checks = []
    if settings.lease_renew_s >= settings.lease_ttl_s:
        checks.append(
            Check(
                FAIL,
                "settings",
                f"KEYTURN_LEASE_RENEW_S ({settings.lease_renew_s}) must be below "
                f"KEYTURN_LEASE_TTL_S ({settings.lease_ttl_s}): every turn would be interrupted",
            )
        )
    elif settings.lease_renew_s > settings.lease_ttl_s / 2:
        checks.append(
            Check(
                WARN,
                "settings",
                f"lease renewed every {settings.lease_renew_s}s of a {settings.lease_ttl_s}s "
                "lease: one slow renewal interrupts a turn",
            )
        )
    log_format = getattr(settings, "log_format", "auto")
    if log_format not in ("auto", "json", "text"):
        checks.append(
            Check(FAIL, "settings", f"KEYTURN_LOG_FORMAT {log_format!r}: auto, json or text")
        )
    if not checks:
        checks.append(Check(OK, "settings", "valid"))
    return checks, settings


async def check_database(url: str, where: str) -> list[Check]:
    from keyturn.db import probes
    from keyturn.db.engine import DatabaseUrlError, connect, create_engine
    from keyturn.db.migrate import current_revision, head_revision

    checks: list[Check] = []
    try:
        engine = create_engine(url, pool_size=1)
    except DatabaseUrlError as error:
        return [Check(FAIL, "database", str(error))]
    try:
        try:
            async with asyncio.timeout(10), connect(engine) as conn:
                facts = await probes.server_facts(conn)
        except Exception as error:
            return [Check(FAIL, "database", f"cannot connect to {where}: {_reason(error)}")]
        status = OK if facts.version_num >= MIN_SERVER_VERSION else WARN
        checks.append(Check(OK, "database", f"reachable ({where})"))
        checks.append(Check(status, "database version", f"PostgreSQL {facts.version}"))
        checks.append(
            Check(OK, "synchronous_commit", facts.synchronous_commit)
            if facts.synchronous_commit != "off"
            else Check(
                WARN, "synchronous_commit", "off: an acknowledged turn may be lost in a crash"
            )
        )
        skew = facts.clock_skew_s
        status = OK if abs(skew) < SKEW_WARN_S else WARN if abs(skew) < SKEW_FAIL_S else FAIL
        checks.append(
            Check(
                status,
                "clock skew",
                f"{skew:+.3f}s (database minus process; leases use the database clock)",
            )
        )
        try:
            current = await current_revision(engine)
        except Exception as error:
            checks.append(Check(FAIL, "migrations", f"cannot read the revision: {_reason(error)}"))
            return checks
    finally:
        await engine.dispose()
    head = head_revision()
    if current == head:
        checks.append(Check(OK, "migrations", f"at head {head}"))
    else:
        checks.append(
            Check(
                FAIL,
                "migrations",
                f"at {current or 'none'}, head is {head}: run `keyturn db upgrade`",
            )
        )
    return checks


def _reason(error: BaseException) -> str:
    """What went wrong, for a person: the driver's own message when there is
    one (it names the host, never the password), else the error's kind."""
    from keyturn.db.engine import connect_failure

    cause = error.__cause__ if error.__cause__ is not None else error
    return connect_failure(error) or str(cause) or type(cause).__name__


def run(database_url: Callable[[Settings], tuple[str, str]], out: Callable[[str], None]) -> int:
    checks, settings = check_settings()
    for check in checks:
        out(check.line())
    if settings is not None:
        try:
            url, where = database_url(settings)
        except Exception as error:
            db_checks = [Check(FAIL, "database", f"cannot start or find it: {error}")]
        else:
            db_checks = asyncio.run(check_database(url, where))
        for check in db_checks:
            out(check.line())
        checks += db_checks
    failed = [c for c in checks if c.status == FAIL]
    out(f"{len(checks)} checks, {len(failed)} failed")
    return 1 if failed else 0
