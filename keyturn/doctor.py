"""``keyturn doctor``: is this installation fit to serve?

One line per check, ``ok``, ``warn`` or ``fail``; the command exits 1 when any
check fails. Checks: the settings, the database (reachable, its version,
``synchronous_commit``), the migrations, and the clock skew between this
process and the database.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg
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
    from keyturn.db.engine import asyncpg_dsn, create_engine
    from keyturn.db.migrate import current_revision, head_revision

    checks: list[Check] = []
    try:
        conn = await asyncio.wait_for(asyncpg.connect(asyncpg_dsn(url)), 10)
    except Exception as error:
        return [Check(FAIL, "database", f"cannot connect to {where}: {error or type(error)}")]
    try:
        version = int(await conn.fetchval("SHOW server_version_num"))
        pretty = await conn.fetchval("SHOW server_version")
        status = OK if version >= MIN_SERVER_VERSION else WARN
        checks.append(Check(OK, "database", f"reachable ({where})"))
        checks.append(Check(status, "database version", f"PostgreSQL {pretty}"))
        sync = await conn.fetchval("SHOW synchronous_commit")
        checks.append(
            Check(OK, "synchronous_commit", sync)
            if sync != "off"
            else Check(
                WARN, "synchronous_commit", "off: an acknowledged turn may be lost in a crash"
            )
        )
        # Clock skew: the database's clock against the midpoint of the round trip.
        before = time.time()
        db_now = float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())"))
        after = time.time()
        skew = db_now - (before + after) / 2
        status = OK if abs(skew) < SKEW_WARN_S else WARN if abs(skew) < SKEW_FAIL_S else FAIL
        checks.append(
            Check(
                status,
                "clock skew",
                f"{skew:+.3f}s (database minus process; leases use the database clock)",
            )
        )
    finally:
        await conn.close()
    engine = create_engine(url, pool_size=1)
    try:
        current = await current_revision(engine)
    except Exception as error:
        checks.append(Check(FAIL, "migrations", f"cannot read the revision: {error}"))
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
