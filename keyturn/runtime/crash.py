"""A test hook: stop this process with SIGKILL at a named point of a tool call.

Configured by ``KEYTURN_CRASH_AT`` (``POINT`` or ``POINT:INDEX``) and
``KEYTURN_CRASH_AFTER`` (how many calls must reach the point first; those
that arrive earlier wait there). Never set it in production. The points:

``before_intent``  before ``tool.intent`` is committed
``after_intent``   after the intent, before the tool runs
``after_write``    after the tool returned (its write committed), before ``tool.result``
``after_result``   after ``tool.result``, before anything else the turn does
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

POINTS = ("before_intent", "after_intent", "after_write", "after_result")

log = logging.getLogger(__name__)


class CrashHook:
    def __init__(self, spec: str | None = None, *, after: int = 1) -> None:
        self.point_name: str | None = None
        self.index: int | None = None
        self.after = after
        self.hits = 0
        if spec:
            name, _, index = spec.partition(":")
            if name not in POINTS:
                raise ValueError(f"crash point must be one of {', '.join(POINTS)} (got {name!r})")
            self.point_name = name
            self.index = int(index) if index else None

    async def point(self, name: str, index: int) -> None:
        if name != self.point_name or (self.index is not None and index != self.index):
            return
        self.hits += 1
        if self.hits >= self.after:
            log.warning("crash hook: SIGKILL at %s (call %d)", name, index)
            os.kill(os.getpid(), signal.SIGKILL)
        # Hold here until the process is killed (or the turn is cancelled).
        await asyncio.Event().wait()
