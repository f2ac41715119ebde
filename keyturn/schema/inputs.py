"""Input types."""

from __future__ import annotations

import strawberry

from keyturn.schema.enums import History


@strawberry.input
class CreateSessionInput:
    default_history: History | None = History.FULL


@strawberry.input
class SubmitTurnInput:
    session_id: strawberry.ID
    idempotency_key: str = strawberry.field(
        description="The client's name for this one intended turn. Send the same key to "
        "retry; use a new key for a new turn."
    )
    input: str
    history: History | None = strawberry.field(
        default=None, description="Omitted: the session's defaultHistory."
    )
