"""``keyturn doctor``: is this installation fit to serve?

One line per check, ``ok``, ``warn`` or ``fail``; the command exits 1 when any
check fails. Checks: the settings, the database (reachable, its version,
``synchronous_commit``), the migrations, the clock skew between this
process and the database, the model (the configured server answers and
lists the configured model; no completion is sent), and the tools: each
Python entry point, the tools file, and each MCP server it names (started,
listed and stopped again), with every tool's kind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError

from keyturn.settings import Settings

if TYPE_CHECKING:
    from keyturn.runtime.tools import Tool

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
    if settings.model == "openai" and not settings.openai_model:
        from keyturn.runtime.openai_model import MODEL_REQUIRED

        checks.append(Check(FAIL, "settings", MODEL_REQUIRED))
    from keyturn.runtime.retention import RetentionPolicy

    retention = RetentionPolicy.of(settings)
    if retention.problem is not None:
        checks.append(Check(FAIL, "settings", retention.problem))
    from keyturn.runtime.crash import problem

    # The test hook (KEYTURN_CRASH_AT, KEYTURN_HOLD_AT): a bad value stops the
    # start here, not with a traceback once the app is built.
    if (hook := problem(settings)) is not None:
        checks.append(Check(FAIL, "settings", hook))
    if not checks:
        checks.append(Check(OK, "settings", "valid"))
    # The published policy (also Query.serverPolicy), whatever else is wrong.
    checks.append(Check(OK, "retention", "; ".join(retention.lines())))
    return checks, settings


async def check_model(settings: Settings) -> list[Check]:
    """Does the configured model server answer, and does it list the model?
    It is asked for its models only: nothing is generated, nothing is billed."""
    if settings.model == "fixture":
        return [Check(OK, "model", "the offline fixture (KEYTURN_MODEL=fixture)")]
    if not settings.openai_model:
        return []  # check_settings has said so
    from keyturn.errors import ModelError
    from keyturn.runtime.openai_model import list_models, server_address

    where = server_address(settings)
    try:
        async with asyncio.timeout(settings.openai_timeout_s + 5):
            models = await list_models(settings)
    except ModelError as error:
        return [Check(FAIL, "model", f"{where} did not list its models: {error}")]
    except TimeoutError:
        return [Check(FAIL, "model", f"{where} did not list its models in time")]
    if settings.openai_model in models:
        return [
            Check(
                OK,
                "model",
                f"{where} answers; {settings.openai_model} is among its {len(models)} model(s)",
            )
        ]
    shown = ", ".join(models[:10]) + (" …" if len(models) > 10 else "")
    return [
        Check(
            WARN,
            "model",
            f"{where} answers, but {settings.openai_model} is not among its models"
            f" ({shown or 'none listed'}): check KEYTURN_OPENAI_MODEL",
        )
    ]


async def check_tools(settings: Settings) -> list[Check]:
    """The tools beyond the builtin ones: what they are, and whether their
    servers start. Header and environment values are never shown."""
    from keyturn.errors import ToolSetupError, ToolsFileError
    from keyturn.runtime.python_tools import load_python_tools
    from keyturn.runtime.tools import BUILTIN, BUILTIN_TOOLS
    from keyturn.runtime.tools_file import load

    # Every name once: which source offers it first.
    offered = {tool.name: BUILTIN for tool in BUILTIN_TOOLS}
    checks: list[Check] = []

    def listed(source: str, tools: Sequence[Tool]) -> str:
        for tool in tools:
            if tool.name in offered:
                checks.append(
                    Check(
                        FAIL,
                        "tools",
                        f"tool {tool.name!r} is offered twice: by {offered[tool.name]} "
                        f"and by {source}",
                    )
                )
            offered.setdefault(tool.name, source)
        return ", ".join(f"{t.name} {t.kind}" for t in tools) or "no tools"

    try:
        for source, tools in load_python_tools():
            checks.append(Check(OK, f"tools {source}", listed(source, tools)))
    except ToolSetupError as error:
        checks.append(Check(FAIL, "python tools", str(error)))
    if settings.tools_file is None:
        checks.append(Check(OK, "tools file", "none (KEYTURN_TOOLS_FILE is unset)"))
        return checks
    try:
        file = load(settings.tools_file)
    except ToolsFileError as error:
        checks.append(Check(FAIL, "tools file", str(error)))
        return checks
    checks.append(Check(OK, "tools file", f"{file.path}: {len(file.servers)} server(s)"))
    # Imported only with a tools file: the SDK takes a while to import.
    from keyturn.runtime.mcp_tools import probe, unoffered_reason

    for found in await probe(file):
        name = f"tool server {found.server}"
        if found.error is not None:
            checks.append(Check(FAIL, name, found.error))
        else:
            tools_listed = listed(f"mcp:{found.server}", found.tools)
            checks.append(Check(OK, name, f"started ({found.where}); {tools_listed}"))
            for tool in found.unoffered:
                checks.append(Check(WARN, name, unoffered_reason(tool)))
    return checks


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
        model_checks = asyncio.run(check_model(settings))
        for check in model_checks:
            out(check.line())
        checks += model_checks
        tool_checks = asyncio.run(check_tools(settings))
        for check in tool_checks:
            out(check.line())
        checks += tool_checks
    failed = [c for c in checks if c.status == FAIL]
    out(f"{len(checks)} checks, {len(failed)} failed")
    return 1 if failed else 0
