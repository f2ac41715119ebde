from __future__ import annotations

import strawberry

from keyturn.resolvers.context import Context

Info = strawberry.Info[Context, None]

__all__ = ["Context", "Info"]
