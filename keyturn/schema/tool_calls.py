"""The tool ledger as clients see it."""

from __future__ import annotations

from typing import cast

import strawberry
from strawberry.scalars import JSON

from keyturn.runtime.ledger import ToolCallView
from keyturn.schema.budget import large
from keyturn.schema.enums import ToolCallState, ToolKind


@strawberry.type(description="One tool call of a turn, as its ledger events establish it.")
class ToolCall:
    index: int = strawberry.field(description="The call's place in the turn: 0, 1, 2 …")
    tool: str
    arguments: JSON = strawberry.field(extensions=large())
    effect_key: str = strawberry.field(
        description="Derived from the turn id and the index; stable across restarts."
    )
    kind: ToolKind
    state: ToolCallState
    result: JSON | None = strawberry.field(
        description="What the tool returned, when recorded.", extensions=large()
    )
    reused_from: strawberry.ID | None = strawberry.field(
        description="A retry's call whose result was reused, not run again: the turn it came from."
    )

    @classmethod
    def from_view(cls, v: ToolCallView) -> ToolCall:
        return cls(
            index=v.index,
            tool=v.tool,
            arguments=cast(JSON, v.arguments),
            effect_key=v.effect_key,
            kind=v.kind,
            state=v.state,
            result=cast(JSON, v.result) if v.result is not None else None,
            reused_from=strawberry.ID(v.reused_from) if v.reused_from else None,
        )
