"""Tools from MCP servers (the tools file, :mod:`keyturn.runtime.tools_file`),
through the official ``mcp`` SDK's client.

Each server is connected once per process and the connection reused. The
SDK's clients are anyio context managers that must be entered and left in
one task, so each connection lives in a task of its own (:meth:`McpServer.hold`);
calls from turns await its session (ClientSession calls are safe from any task
of the loop). The first connection is made at start, before any turn runs: a
server that does not start stops the start with one line naming it.

The server's tools are offered as ``SERVER__TOOL``. Their kind comes from the
annotations, which are hints from a server that may not be trusted, read the
pessimistic way: ``readOnlyHint`` → READ_ONLY, else ``idempotentHint`` →
REPEATABLE, else UNSAFE (MCP's defaults: destructive, not idempotent). The
tools file overrides any of them; IDEMPOTENT only with a ``key_argument`` and
an ``applied_tool`` to ask.

What a call that goes wrong records (each is the call's result, shown to the
model, and the turn goes on):

=================================  ============================================
the call                           recorded
=================================  ============================================
``isError`` result                 ``{"error": TEXT, "content": [...]}``,
                                   COMPLETED: the server answered
JSON-RPC error (the server         ``{"error": MESSAGE, "code": CODE}``,
answered with one)                 COMPLETED: the server answered
the server is not connected and    ``{"error": ...}``, COMPLETED: the call was
does not come back in time         never sent
the server dies during the call    ToolServerDied, which the runner records by
(a stdio process exits, the        kind (:mod:`keyturn.runtime.tool_runner`):
connection closes)                 READ_ONLY an error, COMPLETED; an
                                   IDEMPOTENT tool is asked about its key;
                                   any other, an error saying its effect is
                                   unknown, OUTCOME_UNKNOWN
=================================  ============================================

A death is noticed when the transport ends (a stdio server's stdout closes)
or a call finds the connection closed; the connection's task then connects
again, with a backoff, and the next call waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from mcp.shared.message import SessionMessage

from keyturn.domain import ToolKind
from keyturn.errors import (
    ToolError,
    ToolServerDied,
    ToolServerUnavailable,
    ToolSetupError,
    ToolsFileError,
)
from keyturn.runtime.tools import Tool
from keyturn.runtime.tools_file import (
    OFFERABLE_NAME,
    SEPARATOR,
    ServerConfig,
    ToolsFile,
    tool_name,
)
from keyturn.waits import set_within

log = logging.getLogger(__name__)

# How long a server may take to start and list its tools.
START_TIMEOUT_S = 20.0
_FIRST_BACKOFF_S = 0.2
_MAX_BACKOFF_S = 5.0


def annotated_kind(tool: types.Tool) -> ToolKind:
    """The kind an MCP tool's annotations claim, read pessimistically."""
    hints = tool.annotations
    if hints is not None and hints.readOnlyHint is True:
        return ToolKind.READ_ONLY
    if hints is not None and hints.idempotentHint is True:
        return ToolKind.REPEATABLE
    return ToolKind.UNSAFE


def reason(error: BaseException) -> str:
    """What went wrong, in one line, from the innermost error of a group."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, McpError):
        return error.error.message
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class McpServer:
    """One server's connection, held by a task of its own."""

    def __init__(
        self, config: ServerConfig, *, ready_wait_s: float, start_timeout_s: float = START_TIMEOUT_S
    ) -> None:
        self.config = config
        self.name = config.name
        self.source = f"mcp:{config.name}"
        self.ready_wait_s = ready_wait_s
        self.start_timeout_s = start_timeout_s
        self.listed: list[types.Tool] = []
        self.last_error: str | None = None
        self.connections = 0  # how many times it has connected (restarts + 1)
        # Tools it lists under a name no model API takes: not offered.
        self.unoffered: list[str] = []
        self._session: ClientSession | None = None
        self._ready = asyncio.Event()
        self._broken = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def describe(self) -> str:
        """Where it is, without a secret: the command's program or the URL."""
        if self.config.url is not None:
            return f"streamable HTTP {self.config.url}"
        return f"stdio {self.config.command[0]}"

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Connect for the first time; ToolSetupError, one line, if it cannot."""
        self._task = asyncio.create_task(self.hold(), name=f"keyturn-mcp-{self.name}")
        ready = asyncio.ensure_future(self._ready.wait())
        try:
            await asyncio.wait(
                {ready, self._task},
                timeout=self.start_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
        if not self._ready.is_set():
            why = self.last_error or f"no answer within {self.start_timeout_s:g}s"
            await self.stop()
            raise ToolSetupError(
                f"tool server {self.name!r} ({self.describe()}) did not start: {why}"
            )

    async def stop(self) -> None:
        self._stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        # Leaving the SDK's contexts stops a stdio server; give it a moment.
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def hold(self) -> None:
        """Connect, keep the connection until it breaks, connect again."""
        backoff = _FIRST_BACKOFF_S
        while not self._stopping.is_set():
            try:
                await self._connect_and_hold()
                backoff = _FIRST_BACKOFF_S
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self.last_error = reason(error)
                if self.connections == 0:
                    return  # never connected: start() reports it
            if self._stopping.is_set():
                return
            log.warning(
                "tool server %s: connection lost (%s); connecting again in %.1fs",
                self.name,
                self.last_error or "closed",
                backoff,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def _connect_and_hold(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(self._transport())
            # Messages pass through here so that the end of the transport (a
            # stdio server that exited) is noticed even with no call in flight.
            inbox_in, inbox = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            group = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(group.cancel_scope.cancel)
            group.start_soon(self._forward, read, inbox_in)
            session = await stack.enter_async_context(ClientSession(inbox, write))
            with anyio.fail_after(self.start_timeout_s):
                await session.initialize()
                self.listed = await _list_tools(session)
            self.connections += 1
            self.last_error = None
            self._broken.clear()
            self._session = session
            self._ready.set()
            if self.connections > 1:
                log.info("tool server %s: connected again", self.name)
            try:
                await _first_of(self._broken, self._stopping)
            finally:
                self._ready.clear()
                self._session = None

    @contextlib.asynccontextmanager
    async def _transport(
        self,
    ) -> AsyncIterator[
        tuple[
            MemoryObjectReceiveStream[SessionMessage | Exception],
            MemoryObjectSendStream[SessionMessage],
        ]
    ]:
        config = self.config
        if config.url is not None:
            # Header values are secrets: they go to the HTTP client only.
            client = httpx.AsyncClient(
                headers=config.headers, timeout=httpx.Timeout(30.0, read=300.0)
            )
            async with client, streamable_http_client(config.url, http_client=client) as streams:
                yield streams[0], streams[1]
        else:
            params = StdioServerParameters(
                command=config.command[0],
                args=list(config.command[1:]),
                env=config.env or None,
                cwd=config.cwd,
            )
            async with stdio_client(params, errlog=sys.stderr) as (read, write):
                yield read, write

    async def _forward(
        self,
        read: MemoryObjectReceiveStream[SessionMessage | Exception],
        inbox: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        try:
            async with inbox:
                async for message in read:
                    await inbox.send(message)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            self._broken.set()

    # -- calls ---------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call ``tool`` of this server. ToolServerUnavailable: not sent.
        ToolServerDied: sent, and the connection ended before an answer.
        McpError: the server answered with a JSON-RPC error."""
        session = await self._session_for_call()
        try:
            return await session.call_tool(tool, arguments)
        except McpError as error:
            if error.error.code == types.CONNECTION_CLOSED:
                self._broken.set()
                raise ToolServerDied(
                    f"tool server {self.name!r} went away during the call"
                ) from None
            raise
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, httpx.TransportError):
            self._broken.set()
            raise ToolServerDied(f"tool server {self.name!r} went away during the call") from None

    async def _session_for_call(self) -> ClientSession:
        if self._session is None or self._broken.is_set():
            await set_within(self._ready, self.ready_wait_s)
        session = self._session
        if session is None or not self._ready.is_set():
            why = f": {self.last_error}" if self.last_error else ""
            raise ToolServerUnavailable(
                f"tool server {self.name!r} is not connected{why}; the call was not sent"
            )
        return session


async def _first_of(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(cursor)
        tools.extend(page.tools)
        cursor = page.nextCursor
        if not cursor:
            return tools


def _content(result: types.CallToolResult) -> list[dict[str, Any]]:
    return [block.model_dump(mode="json", exclude_none=True) for block in result.content]


def _text(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


def recorded(result: types.CallToolResult) -> dict[str, Any]:
    """A call's result as the ledger saves it and the model is shown it."""
    content = _content(result)
    if result.isError:
        return {"error": _text(result) or "the tool reported an error", "content": content}
    # Structured content, when given, says what the text blocks repeat.
    if result.structuredContent is not None:
        return {"structuredContent": result.structuredContent}
    return {"content": content}


def applied_answer(result: types.CallToolResult) -> bool | None:
    """``{"applied": true|false}``, structured or as JSON text; None if neither."""
    answer: Any = result.structuredContent
    if not isinstance(answer, dict) or "applied" not in answer:
        try:
            answer = json.loads(_text(result))
        except ValueError:
            return None
    if isinstance(answer, dict) and isinstance(answer.get("applied"), bool):
        return bool(answer["applied"])
    return None


class McpTool:
    """One tool of an MCP server, as Keyturn offers it."""

    def __init__(
        self,
        server: McpServer,
        listed: types.Tool,
        *,
        kind: ToolKind,
        key_argument: str | None = None,
        applied_tool: str | None = None,  # the server's own name for it
    ) -> None:
        self.server = server
        self.remote = listed.name
        self.name = tool_name(server.name, listed.name)
        self.kind = kind
        self.description = listed.description or listed.title or ""
        self.parameters: dict[str, Any] = dict(listed.inputSchema)
        self.key_argument = key_argument
        self.applied_tool = applied_tool
        if key_argument is not None:
            # The runtime fills the key in; the model is not asked for it.
            properties = dict(self.parameters.get("properties") or {})
            properties.pop(key_argument, None)
            required = [r for r in self.parameters.get("required") or [] if r != key_argument]
            self.parameters = {**self.parameters, "properties": properties, "required": required}

    async def run(self, arguments: dict[str, Any], *, effect_key: str) -> dict[str, Any]:
        sent = dict(arguments)
        if self.key_argument is not None:
            sent[self.key_argument] = effect_key
        try:
            result = await self.server.call(self.remote, sent)
        except ToolServerUnavailable as error:
            return {"error": str(error)}
        except McpError as error:
            # An answer: the server said the request failed.
            return {"error": error.error.message, "code": error.error.code}
        # ToolServerDied: sent and never answered, for the runner to record
        # by the tool's kind.
        return recorded(result)

    async def applied(self, effect_key: str) -> bool:
        if self.applied_tool is None or self.key_argument is None:
            raise ToolError(f"{self.name} cannot be asked whether an effect was applied")
        # Not connected or gone mid-question: asked again later (not a ToolError).
        result = await self.server.call(self.applied_tool, {self.key_argument: effect_key})
        if result.isError:
            # Perhaps passing (its own store did not answer): asked again later.
            raise RuntimeError(f"{self.name}: {self.applied_tool} answered an error")
        answer = applied_answer(result)
        if answer is None:
            raise ToolError(
                f'{self.server.name}{SEPARATOR}{self.applied_tool} did not answer {{"applied": '
                "true|false}"
            )
        return answer


class McpServers:
    """Every server of the tools file, and their tools."""

    def __init__(self, file: ToolsFile | None, *, ready_wait_s: float) -> None:
        self.file = file
        self.servers = [
            McpServer(config, ready_wait_s=ready_wait_s)
            for config in (file.servers if file else ())
        ]

    async def start(self, *, warn: bool = True) -> list[tuple[str, list[Tool]]]:
        """Connect every server (at once); each server's source and tools.
        ToolSetupError on the first that fails, the others stopped. With
        ``warn``, a tool left unoffered (its name) is logged."""
        started = await asyncio.gather(
            *(server.start() for server in self.servers), return_exceptions=True
        )
        failed = [e for e in started if isinstance(e, BaseException)]
        if failed:
            await self.stop()
            if isinstance(failed[0], ToolSetupError):
                raise failed[0]
            raise ToolSetupError(f"tool servers did not start: {reason(failed[0])}")
        try:
            found = [(server.source, self._tools_of(server)) for server in self.servers]
        except (ToolSetupError, ToolsFileError):
            await self.stop()
            raise
        for server in self.servers if warn else ():
            for tool in server.unoffered:
                log.warning("tool server %s: %s", server.name, unoffered_reason(tool))
        return found

    async def stop(self) -> None:
        await asyncio.gather(*(server.stop() for server in self.servers))

    def _tools_of(self, server: McpServer) -> list[Tool]:
        assert self.file is not None
        overrides = self.file.overrides
        offered = {t.name: t for t in server.listed}
        for name, override in overrides.items():
            owner, _, remote = name.partition(SEPARATOR)
            if owner != server.name:
                continue
            key = f'tools."{name}"'
            if remote not in offered:
                raise self.file.problem(key, f"server {server.name!r} offers no tool {remote!r}")
            asked = (override.applied_tool or "").partition(SEPARATOR)[2]
            if override.applied_tool is not None and asked not in offered:
                raise self.file.problem(
                    f"{key}.applied_tool", f"server {server.name!r} offers no tool {asked!r}"
                )
        tools: list[Tool] = []
        for listed in server.listed:
            name = tool_name(server.name, listed.name)
            if not OFFERABLE_NAME.match(name):
                server.unoffered.append(listed.name)
                continue
            found = overrides.get(name)
            if found is None:
                tools.append(McpTool(server, listed, kind=annotated_kind(listed)))
            else:
                tools.append(
                    McpTool(
                        server,
                        listed,
                        kind=found.kind,
                        key_argument=found.key_argument,
                        applied_tool=(found.applied_tool or "").partition(SEPARATOR)[2] or None,
                    )
                )
        return tools


def unoffered_reason(tool: str) -> str:
    return (
        f"tool {tool!r} is not offered: a model calls tools by names of up to 64 letters,"
        " digits, '_' and '-'"
    )


@dataclass(frozen=True, slots=True)
class Probe:
    """One server started, listed and stopped again (``keyturn doctor``)."""

    server: str
    where: str
    tools: list[Tool]
    error: str | None = None  # one line: why it did not start
    unoffered: tuple[str, ...] = ()  # tools listed under names no model API takes


async def probe(file: ToolsFile) -> list[Probe]:
    """Start each server of the file on its own, list its tools, stop it."""

    async def one(config: ServerConfig) -> Probe:
        servers = McpServers(replace(file, servers=(config,)), ready_wait_s=1.0)
        where = servers.servers[0].describe()
        try:
            [(_source, tools)] = await servers.start(warn=False)
        except (ToolSetupError, ToolsFileError) as error:
            return Probe(config.name, where, [], str(error))
        await servers.stop()
        return Probe(config.name, where, tools, unoffered=tuple(servers.servers[0].unoffered))

    return list(await asyncio.gather(*(one(config) for config in file.servers)))
