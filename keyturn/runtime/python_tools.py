"""Tools from Python distributions, found by entry point.

A distribution offers tools under the entry point group ``keyturn.tools``;
each entry point names a factory that takes no argument and returns one tool
or a list of them (see :class:`keyturn.runtime.tools.Tool`: ``name``,
``kind``, ``description``, ``parameters``, ``run``, and ``applied`` for an
IDEMPOTENT tool). Their source is ``python:ENTRYPOINT``. Loaded once, at
start; a factory that fails, or a tool that lacks what it must declare, stops
the start with one line naming the entry point.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

from keyturn.domain import ToolKind
from keyturn.errors import ToolSetupError
from keyturn.runtime.tools import Tool

GROUP = "keyturn.tools"


def source_of(entry_point: str) -> str:
    return f"python:{entry_point}"


def load_python_tools() -> list[tuple[str, list[Tool]]]:
    """Each entry point's source and tools, in the order of their names."""
    seen: dict[str, EntryPoint] = {}
    for point in entry_points(group=GROUP):
        # The same distribution found twice on the path is one offer.
        if point.name in seen and seen[point.name].value != point.value:
            raise ToolSetupError(
                f"entry point {point.name!r} of {GROUP} is declared twice "
                f"({seen[point.name].value} and {point.value})"
            )
        seen[point.name] = point
    return [(source_of(name), _load(seen[name])) for name in sorted(seen)]


def _load(point: EntryPoint) -> list[Tool]:
    where = f"entry point {point.name!r} of {GROUP} ({point.value})"
    try:
        factory = point.load()
        made = factory()
    except Exception as error:
        raise ToolSetupError(f"{where} failed: {type(error).__name__}: {error}") from None
    tools = list(made) if isinstance(made, list | tuple) else [made]
    if not tools:
        raise ToolSetupError(f"{where} returned no tool")
    for tool in tools:
        _check(tool, where)
    return tools


def _check(tool: Any, where: str) -> None:
    name = getattr(tool, "name", None)
    if not isinstance(name, str) or not name:
        raise ToolSetupError(f"{where}: a tool without a name (a non-empty str)")
    if not isinstance(getattr(tool, "kind", None), ToolKind):
        kinds = ", ".join(f"ToolKind.{k.name}" for k in ToolKind)
        raise ToolSetupError(f"{where}: tool {name!r} must declare its kind, one of {kinds}")
    if not isinstance(getattr(tool, "description", None), str):
        raise ToolSetupError(f"{where}: tool {name!r} needs a description (a str)")
    if not isinstance(getattr(tool, "parameters", None), dict):
        raise ToolSetupError(f"{where}: tool {name!r} needs parameters (a JSON Schema dict)")
    if not callable(getattr(tool, "run", None)):
        raise ToolSetupError(f"{where}: tool {name!r} needs an async run(arguments, *, effect_key)")
    if tool.kind is ToolKind.IDEMPOTENT and not callable(getattr(tool, "applied", None)):
        raise ToolSetupError(
            f"{where}: IDEMPOTENT tool {name!r} needs an async applied(effect_key) -> bool"
        )
