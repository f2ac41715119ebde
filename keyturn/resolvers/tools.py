"""The tools this process offers."""

from __future__ import annotations

from keyturn.resolvers.context import Context
from keyturn.runtime.tools import ToolInfo


def list_tools(ctx: Context) -> list[ToolInfo]:
    return ctx.runtime.tool_infos()
