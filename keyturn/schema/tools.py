"""The tools a server offers, as clients see them."""

from __future__ import annotations

import strawberry

from keyturn.runtime.tools import ToolInfo as ToolInfoRecord
from keyturn.schema.enums import ToolKind


@strawberry.type(description="A tool this server offers the model.")
class ToolInfo:
    name: str = strawberry.field(
        description="What the model calls it: SERVER__TOOL for a tool of an MCP server."
    )
    kind: ToolKind
    source: str = strawberry.field(
        description="Where it comes from: builtin, mcp:SERVER or python:ENTRYPOINT."
    )
    description: str

    @classmethod
    def from_info(cls, info: ToolInfoRecord) -> ToolInfo:
        return cls(name=info.name, kind=info.kind, source=info.source, description=info.description)
