"""Input types."""

from __future__ import annotations

import strawberry

from keyturn.schema.conversion import converted_once
from keyturn.schema.enums import History, Multitask


@converted_once
@strawberry.input
class CreateSessionInput:
    default_history: History | None = History.FULL
    multitask: Multitask | None = strawberry.field(
        default=Multitask.ENQUEUE,
        description="What a submission does while a turn of the session is queued or running "
        "(a submission may say otherwise for itself).",
    )


@converted_once
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
    multitask: Multitask | None = strawberry.field(
        default=None,
        description="What to do if a turn of the session is queued or running. Omitted: the "
        "session's multitask. Part of the request a key names.",
    )
