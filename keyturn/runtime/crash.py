"""A test hook: stop this process with SIGKILL, or hold a call, at a named
point of a tool call, of its reconciliation or of a retention batch. Never
set it in production.

``KEYTURN_CRASH_AT`` (``POINT`` or ``POINT:INDEX``) and ``KEYTURN_CRASH_AFTER``
(how many calls must reach the point first; those that arrive earlier wait
there) kill the process. ``KEYTURN_HOLD_AT`` (``POINT`` or ``POINT:INDEX``)
holds every call that reaches the point until the file named by
``KEYTURN_HOLD_UNTIL`` exists, then lets it go on: whoever runs the process
releases the held calls by creating the file (a call arriving once it exists
is not held). A held call is as in flight as a slow tool, so a cancel or a
kill can be made to arrive at a known point of it. The points:

``before_intent``  before ``tool.intent`` is committed
``after_intent``   after the intent, before the tool runs
``after_write``    after the tool returned (its write committed), before ``tool.result``
``after_result``   after ``tool.result``, before anything else the turn does

and of the retention sweeper (:mod:`keyturn.runtime.retention`), whose INDEX
is the batch's number in its pass, counting from 0 the batches that removed
rows:

``prune_batch``    after a batch's statement removed its rows, before its commit

and of the reconciliation of an interrupted turn's unknown calls
(:meth:`keyturn.runtime.tool_runner.ToolRunner.reconcile`, whoever asks: the
process that interrupted the turn, or a retry settling it first), whose INDEX
is the call's:

``before_reconciled``  after the IDEMPOTENT tool answered whether the call's
                       key was applied, before ``tool.reconciled`` records it

A bad value is refused when the process starts (:func:`problem`, which
``keyturn serve`` and ``keyturn doctor`` check).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keyturn.settings import Settings

# The points of a tool call (the interruption experiment visits each).
POINTS = ("before_intent", "after_intent", "after_write", "after_result")
SWEEPER_POINTS = ("prune_batch",)
# Held there, the store has answered and the record does not say so yet: the
# moment a retry racing the reconciliation must not run the call.
RECONCILE_POINTS = ("before_reconciled",)
# How often a held call looks for the release file: it is a test hook, and
# a few tens of milliseconds are nothing beside a process start.
HOLD_POLL_S = 0.05

log = logging.getLogger(__name__)


def _parse(spec: str, variable: str) -> tuple[str, int | None]:
    name, colon, index = spec.partition(":")
    if name not in POINTS + SWEEPER_POINTS + RECONCILE_POINTS:
        raise ValueError(
            f"{variable} must be POINT or POINT:INDEX with POINT one of "
            f"{', '.join(POINTS + SWEEPER_POINTS + RECONCILE_POINTS)}"
            f" (got {spec!r})"
        )
    if not colon:
        return name, None
    if not (index.isascii() and index.isdigit()):
        raise ValueError(
            f"{variable}: INDEX must be a call's index, a whole number from 0 (got {spec!r})"
        )
    return name, int(index)


class CrashHook:
    def __init__(
        self,
        spec: str | None = None,
        *,
        after: int = 1,
        hold_at: str | None = None,
        hold_until: Path | str | None = None,
    ) -> None:
        self.point_name: str | None = None
        self.index: int | None = None
        self.after = after
        self.hits = 0
        if spec:
            self.point_name, self.index = _parse(spec, "KEYTURN_CRASH_AT")
        self.hold_name: str | None = None
        self.hold_index: int | None = None
        self.hold_until = Path(hold_until) if hold_until else None
        if hold_at:
            self.hold_name, self.hold_index = _parse(hold_at, "KEYTURN_HOLD_AT")
            if self.hold_until is None:
                raise ValueError(
                    "KEYTURN_HOLD_AT needs KEYTURN_HOLD_UNTIL, the file whose appearance "
                    "releases the held calls (without it they would wait forever)"
                )
        elif self.hold_until is not None:
            raise ValueError("KEYTURN_HOLD_UNTIL is set without KEYTURN_HOLD_AT: it holds nothing")

    @classmethod
    def from_settings(cls, settings: Settings) -> CrashHook:
        return cls(
            settings.crash_at,
            after=settings.crash_after,
            hold_at=settings.hold_at,
            hold_until=settings.hold_until,
        )

    async def point(self, name: str, index: int) -> None:
        if self._at(name, index, self.hold_name, self.hold_index):
            await self._hold(name, index)
        if not self._at(name, index, self.point_name, self.index):
            return
        self.hits += 1
        if self.hits >= self.after:
            log.warning("crash hook: SIGKILL at %s (call %d)", name, index)
            os.kill(os.getpid(), signal.SIGKILL)
        # Hold here until the process is killed (or the turn is cancelled).
        await asyncio.Event().wait()

    @staticmethod
    def _at(name: str, index: int, point: str | None, at: int | None) -> bool:
        return name == point and (at is None or index == at)

    async def _hold(self, name: str, index: int) -> None:
        release = self.hold_until
        assert release is not None  # checked when the hook was made
        # The release comes from outside the process (a file appears), so
        # nothing here could set an event: the file is looked for.
        for waits in itertools.count():
            if release.exists():
                return
            if not waits:
                log.info("hold hook: call %d held at %s until its release file exists", index, name)
            await asyncio.sleep(HOLD_POLL_S)


def problem(settings: Settings) -> str | None:
    """What is wrong with the hook's settings, or None."""
    try:
        CrashHook.from_settings(settings)
    except ValueError as error:
        return str(error)
    return None
