"""What every resolver receives: the process's runtime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keyturn.runtime.process import Runtime


@dataclass
class Context:
    runtime: Runtime
    request: Any = None
    response: Any = None
    # The caller's tenant, from its token ("" when the server runs open).
    tenant: str = ""
    # The WebSocket connection_init payload (set by Strawberry).
    connection_params: dict[str, Any] | None = None
