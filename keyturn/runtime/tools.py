"""Tools the model may call, each declaring what a repeat would do.

``READ_ONLY``   changes nothing; running it again is harmless.
``REPEATABLE``  repeating a call with the same arguments adds no effect, but it
                cannot be asked whether a call happened.
``IDEMPOTENT``  accepts the call's effect key, applies a key at most once, and
                can be asked whether a key was applied.
``UNSAFE``      may change something each time it runs; nobody can ask it.

The synthetic tools write to a store that is not the runtime's record (its own
table, on the store's own connections and transactions), so a crash between
the store and the ledger can be observed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from keyturn.db import synthetic_store as store
from keyturn.db.engine import Engine, connect
from keyturn.domain import ToolKind
from keyturn.errors import EffectRefused, ToolError, ToolSetupError
from keyturn.runtime.model import ToolSpec


class Tool(Protocol):
    name: str
    kind: ToolKind
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments, as the model is shown it

    async def run(self, arguments: dict[str, Any], *, effect_key: str) -> dict[str, Any]:
        """Do the call; the result is shown to the model and saved in ``tool.result``."""
        ...

    async def applied(self, effect_key: str) -> bool:
        """IDEMPOTENT tools: was ``effect_key`` applied? The answer must be final."""
        ...


def _text(arguments: dict[str, Any], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str):
        raise ToolError(f"argument {name!r} must be a string")
    return value


def _arguments(*names: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string"} for name in names},
        "required": list(names),
        "additionalProperties": False,
    }


class _StoreTool:
    name = ""
    kind = ToolKind.UNSAFE
    description = ""
    parameters = _arguments("name", "value")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def applied(self, effect_key: str) -> bool:
        raise ToolError(f"{self.name} cannot be asked whether an effect was applied")


class SyntheticWrite(_StoreTool):
    """Writes NAME=VALUE keyed by the effect key: at most once per key."""

    name = "synthetic_write"
    kind = ToolKind.IDEMPOTENT
    description = "Set NAME to VALUE in the synthetic store, at most once per call."

    async def run(self, arguments: dict[str, Any], *, effect_key: str) -> dict[str, Any]:
        async with connect(self.engine) as conn:
            outcome = await store.write(
                conn,
                key=effect_key,
                tool=self.name,
                idempotent=True,
                name=_text(arguments, "name"),
                value=_text(arguments, "value"),
            )
        if outcome is store.Write.SETTLED_NOT_APPLIED:
            raise EffectRefused(
                f"effect {effect_key} was settled as not applied; it will not apply"
            )
        return {"applied": True, "alreadyApplied": outcome is store.Write.ALREADY_APPLIED}

    async def applied(self, effect_key: str) -> bool:
        async with connect(self.engine) as conn:
            return await store.settle(conn, key=effect_key, tool=self.name)


class SyntheticAppend(_StoreTool):
    """Appends NAME=VALUE every time it runs; it keeps the effect key only so
    an observer can count."""

    name = "synthetic_append"
    kind = ToolKind.UNSAFE
    description = "Append VALUE under NAME in the synthetic store; every run appends again."

    async def run(self, arguments: dict[str, Any], *, effect_key: str) -> dict[str, Any]:
        async with connect(self.engine) as conn:
            await store.write(
                conn,
                key=effect_key,
                tool=self.name,
                idempotent=False,
                name=_text(arguments, "name"),
                value=_text(arguments, "value"),
            )
        return {"applied": True}


class SyntheticRead(_StoreTool):
    """The latest value written under NAME."""

    name = "synthetic_read"
    kind = ToolKind.READ_ONLY
    description = "The latest value written under NAME in the synthetic store."
    parameters = _arguments("name")

    async def run(self, arguments: dict[str, Any], *, effect_key: str) -> dict[str, Any]:
        async with connect(self.engine) as conn:
            return {"value": await store.latest(conn, name=_text(arguments, "name"))}


BUILTIN = "builtin"  # the source of the synthetic tools


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """One tool this process offers, and where it comes from: ``builtin``,
    ``mcp:SERVER`` or ``python:ENTRYPOINT``."""

    name: str
    kind: ToolKind
    source: str
    description: str


class Tools:
    def __init__(self, tools: list[Tool], *, source: str = BUILTIN) -> None:
        self._tools: dict[str, Tool] = {}
        self._sources: dict[str, str] = {}
        self.add(tools, source=source)

    def add(self, tools: list[Tool], *, source: str) -> None:
        """Offer more tools (at start, before any turn runs); a name offered
        twice is refused rather than one tool silently hiding another."""
        for tool in tools:
            if tool.name in self._tools:
                raise ToolSetupError(
                    f"tool {tool.name!r} is offered twice: by {self._sources[tool.name]} "
                    f"and by {source}"
                )
            self._tools[tool.name] = tool
            self._sources[tool.name] = source

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def infos(self) -> list[ToolInfo]:
        """Every tool offered, by name."""
        return [
            ToolInfo(t.name, t.kind, self._sources[t.name], t.description)
            for t in sorted(self._tools.values(), key=lambda t: t.name)
        ]

    def specs(self) -> list[ToolSpec]:
        """The tools as a model is told about them, in a stable order."""
        return [
            ToolSpec(t.name, t.description, t.parameters)
            for t in sorted(self._tools.values(), key=lambda t: t.name)
        ]

    def kind_of(self, name: str) -> ToolKind:
        tool = self._tools.get(name)
        # A tool nobody knows could have done anything.
        return tool.kind if tool is not None else ToolKind.UNSAFE


BUILTIN_TOOLS = (SyntheticWrite, SyntheticAppend, SyntheticRead)


def synthetic_tools(store_engine: Engine) -> Tools:
    return Tools([tool(store_engine) for tool in BUILTIN_TOOLS])
