"""``Query.serverPolicy``: the retention policy the server publishes, so a
client can tell how long a key answers replays before it relies on one."""

from __future__ import annotations

import strawberry

from keyturn.runtime.retention import RetentionPolicy
from keyturn.settings import format_retention


@strawberry.type(
    description="How long this server keeps what it promised. Each retention is in seconds "
    "(null: forever) and in a human form (forever, 90s, 24h, 30d)."
)
class ServerPolicy:
    key_retention_seconds: int | None = strawberry.field(
        description="How long after its turn ended a key answers replays; then a retry with "
        "it answers KeyExpired (never a new turn). Null: forever."
    )
    key_retention: str
    turn_retention_seconds: int | None = strawberry.field(
        description="How long after it ended a turn keeps its input, output and event data; "
        "then it is pruned, and a tombstone keeps its key. Null: forever."
    )
    turn_retention: str
    tombstone_retention_seconds: int | None = strawberry.field(
        description="How long after its turn was pruned a tombstone is kept; after it, the "
        "key is forgotten and a submission with it is a new turn. Null: forever."
    )
    tombstone_retention: str

    @classmethod
    def from_policy(cls, policy: RetentionPolicy) -> ServerPolicy:
        return cls(
            key_retention_seconds=policy.key_s,
            key_retention=format_retention(policy.key_s),
            turn_retention_seconds=policy.turn_s,
            turn_retention=format_retention(policy.turn_s),
            tombstone_retention_seconds=policy.tombstone_s,
            tombstone_retention=format_retention(policy.tombstone_s),
        )
