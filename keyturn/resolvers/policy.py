"""What the server promises about the record's lifetime."""

from __future__ import annotations

from keyturn.resolvers.context import Context
from keyturn.runtime.retention import RetentionPolicy


def server_policy(ctx: Context) -> RetentionPolicy:
    return RetentionPolicy.of(ctx.runtime.settings)
