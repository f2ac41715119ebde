"""Input types."""

from __future__ import annotations

import strawberry

from keyturn.schema.enums import HistoryMode


@strawberry.input
class CreateSessionInput:
    default_history: HistoryMode | None = HistoryMode.FULL


@strawberry.input
class SubmitTurnInput:
    session_id: strawberry.ID
    idempotency_key: str = strawberry.field(
        description="The client's name for this one intended turn. Send the same key to "
        "retry; use a new key for a new turn."
    )
    input: str
    history: HistoryMode | None = strawberry.field(
        default=None, description="Omitted: the session's defaultHistory."
    )
