"""The tools file (``KEYTURN_TOOLS_FILE``): which MCP servers to connect to,
and what to believe about their tools.

::

    [servers.files]                      # stdio: Keyturn starts the process
    command = ["python", "-m", "files_server"]
    env = { ROOT = "/srv/files" }
    cwd = "/srv"                         # optional; relative to this file

    [servers.search]                     # streamable HTTP
    url = "http://127.0.0.1:9000/mcp"
    headers = { Authorization = "Bearer ..." }

    [tools."files__delete"]              # per-tool overrides
    kind = "UNSAFE"

    [tools."files__write"]               # a keyed tool Keyturn can ask
    kind = "IDEMPOTENT"
    key_argument = "key"
    applied_tool = "files__was_applied"
    approve = true                       # each call waits for decideToolCall

    [tools."synthetic_append"]           # any tool offered, builtin or Python:
    approve = false                      # approve alone (over KEYTURN_APPROVE_UNSAFE)

Read once, at start, and checked strictly: any mistake is one line naming the
file and the key. Header and environment values are secrets; they are never
part of a message or a repr.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from keyturn.domain import ToolKind
from keyturn.errors import ToolsFileError

# Between a server's name and its tool's in the name the model is shown.
SEPARATOR = "__"
# What a model API accepts as a function's name (OpenAI's rule, which the
# servers that copy its API keep): a tool named otherwise cannot be offered.
OFFERABLE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*$")
_SERVER_KEYS = {"command", "env", "cwd", "url", "headers"}
_OVERRIDE_KEYS = {"kind", "key_argument", "applied_tool", "approve"}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    name: str
    command: tuple[str, ...] = ()  # stdio
    url: str | None = None  # streamable HTTP
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict, repr=False)
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "http" if self.url is not None else "stdio"


@dataclass(frozen=True, slots=True)
class ToolOverride:
    """What the file says of one tool, over what its server's annotations say."""

    name: str  # SERVER__TOOL
    kind: ToolKind
    key_argument: str | None = None  # IDEMPOTENT: the argument that carries the effect key
    applied_tool: str | None = None  # IDEMPOTENT: SERVER__TOOL asked "was this key applied?"


@dataclass(frozen=True, slots=True)
class ToolsFile:
    path: Path
    servers: tuple[ServerConfig, ...]
    overrides: dict[str, ToolOverride]
    # Tools whose calls wait for a decision (True) or never do (False).
    approvals: dict[str, bool] = field(default_factory=dict)

    def problem(self, key: str, message: str) -> ToolsFileError:
        return _problem(self.path, key, message)


def _problem(path: Path, key: str, message: str) -> ToolsFileError:
    where = f"{key}: " if key else ""
    return ToolsFileError(f"KEYTURN_TOOLS_FILE {path}: {where}{message}")


def tool_name(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{tool}"


def load(path: Path) -> ToolsFile:
    """The file, checked; ToolsFileError (one line) on any mistake."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise _problem(path, "", f"cannot read it ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise _problem(path, "", "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        raise _problem(path, "", f"not valid TOML ({error})") from None
    return parse(path, raw)


def parse(path: Path, raw: dict[str, Any]) -> ToolsFile:
    unknown = sorted(set(raw) - {"servers", "tools"})
    if unknown:
        raise _problem(path, unknown[0], "unknown key (expected servers or tools)")
    servers_raw = _table(path, raw.get("servers", {}), "servers")
    servers = tuple(_server(path, name, value) for name, value in servers_raw.items())
    names = {s.name for s in servers}
    overrides_raw = _table(path, raw.get("tools", {}), "tools")
    approvals: dict[str, bool] = {}
    overrides: dict[str, ToolOverride] = {}
    for name, value in overrides_raw.items():
        table = _table(path, value, f'tools."{name}"')
        if "approve" in table:
            if not isinstance(table["approve"], bool):
                raise _problem(path, f'tools."{name}".approve', "must be true or false")
            approvals[name] = table["approve"]
        # ``approve`` alone names any tool offered; a kind only a server's.
        rest = {k: v for k, v in table.items() if k != "approve"}
        if rest or "approve" not in table:
            overrides[name] = _override(path, name, rest, names)
    return ToolsFile(path, servers, overrides, approvals)


def _table(path: Path, value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _problem(path, key, "must be a table")
    return value


def _strings(path: Path, value: Any, key: str) -> dict[str, str]:
    table = _table(path, value, key)
    for name, item in table.items():
        if not isinstance(item, str):
            raise _problem(path, f"{key}.{name}", "must be a string")
    return dict(table)


def _server(path: Path, name: str, value: Any) -> ServerConfig:
    key = f"servers.{name}"
    if not _SERVER_NAME.match(name):
        raise _problem(
            path, key, "a server's name is letters, digits, '-' and single '_' (no '__')"
        )
    table = _table(path, value, key)
    unknown = sorted(set(table) - _SERVER_KEYS)
    if unknown:
        raise _problem(path, f"{key}.{unknown[0]}", f"unknown key (expected {_keys(_SERVER_KEYS)})")
    has_command, has_url = "command" in table, "url" in table
    if has_command == has_url:
        raise _problem(path, key, "needs exactly one of command (stdio) or url (streamable HTTP)")
    if has_command:
        command = table["command"]
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(part, str) and part for part in command)
        ):
            raise _problem(path, f"{key}.command", "must be a non-empty list of strings")
        for extra in ("headers",):
            if extra in table:
                raise _problem(path, f"{key}.{extra}", "only for a server with a url")
        cwd = table.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise _problem(path, f"{key}.cwd", "must be a string")
        if cwd is not None:
            # Relative to the file, like everything else it names.
            cwd = str(path.parent / cwd)
        return ServerConfig(
            name,
            command=tuple(command),
            cwd=cwd,
            env=_strings(path, table.get("env", {}), f"{key}.env"),
        )
    url = table["url"]
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
        raise _problem(path, f"{key}.url", "must be an http:// or https:// URL")
    for extra in ("env", "cwd"):
        if extra in table:
            raise _problem(path, f"{key}.{extra}", "only for a server with a command")
    return ServerConfig(
        name, url=url, headers=_strings(path, table.get("headers", {}), f"{key}.headers")
    )


def _override(path: Path, name: str, value: Any, servers: set[str]) -> ToolOverride:
    key = f'tools."{name}"'
    server, sep, tool = name.partition(SEPARATOR)
    if not sep or not tool or server not in servers:
        raise _problem(path, key, "must be SERVER__TOOL, SERVER one of this file's servers")
    table = _table(path, value, key)
    unknown = sorted(set(table) - _OVERRIDE_KEYS)
    if unknown:
        raise _problem(
            path, f"{key}.{unknown[0]}", f"unknown key (expected {_keys(_OVERRIDE_KEYS)})"
        )
    kinds = ", ".join(k.value for k in ToolKind)
    try:
        kind = ToolKind(str(table.get("kind")))
    except ValueError:
        raise _problem(path, f"{key}.kind", f"must be one of {kinds}") from None
    key_argument, applied_tool = table.get("key_argument"), table.get("applied_tool")
    if kind is not ToolKind.IDEMPOTENT:
        for extra in ("key_argument", "applied_tool"):
            if extra in table:
                raise _problem(path, f"{key}.{extra}", 'only with kind = "IDEMPOTENT"')
        return ToolOverride(name, kind)
    # Keyturn can only reconcile a tool it can hand a key and ask about it.
    if not isinstance(key_argument, str) or not key_argument:
        raise _problem(
            path,
            f"{key}.key_argument",
            "an IDEMPOTENT tool needs the name of the argument that carries the effect key",
        )
    if not isinstance(applied_tool, str) or not applied_tool.startswith(server + SEPARATOR):
        raise _problem(
            path,
            f"{key}.applied_tool",
            f"an IDEMPOTENT tool needs {server}{SEPARATOR}TOOL, a tool of the same server "
            'that answers {"applied": true|false} for a key',
        )
    return ToolOverride(name, kind, key_argument, applied_tool)


def _keys(keys: set[str]) -> str:
    return ", ".join(sorted(keys))
