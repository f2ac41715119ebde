"""The process's long-lived background tasks, watched.

Each task (the worker's claim loop, the bus's safety-net poll, the listener
and its notifier, the token watch, the metrics sampler) is a coroutine that
runs until cancelled (or returns when its work is over), handling the
failures it expects (a database that does not answer) itself. One that dies
anyway is logged (one line: what and where) and started again after a backoff; from
its death until it has run ``settle_s`` without dying again it counts as
down, and ``/readyz`` answers 503 naming it, so a load balancer stops
sending work to a process that cannot do it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class _Task:
    name: str
    run: Callable[[], Awaitable[None]]
    task: asyncio.Task[None] | None = None
    running_since: float | None = None
    failed_at: float | None = None
    restarts: int = 0


class Supervisor:
    def __init__(
        self, *, backoff_s: float = 0.2, max_backoff_s: float = 5.0, settle_s: float = 1.0
    ) -> None:
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.settle_s = settle_s
        self._tasks: dict[str, _Task] = {}
        self._started = False

    def add(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Watch ``run()`` under ``name``; started now if the supervisor runs."""
        if name in self._tasks:
            raise ValueError(f"a task named {name!r} is supervised already")
        spec = _Task(name, run)
        self._tasks[name] = spec
        if self._started:
            self._launch(spec)

    def start(self) -> None:
        self._started = True
        for spec in self._tasks.values():
            if spec.task is None:
                self._launch(spec)

    def _launch(self, spec: _Task) -> None:
        spec.task = asyncio.create_task(self._keep(spec), name=f"keyturn-{spec.name}")

    async def _keep(self, spec: _Task) -> None:
        backoff = self.backoff_s
        while True:
            spec.running_since = time.monotonic()
            try:
                await spec.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "background task %s died; starting it again in %.1fs", spec.name, backoff
                )
            else:
                # Finished on purpose (the worker's claim loop ends when the
                # process drains): not restarted, not down.
                spec.running_since = spec.failed_at = None
                log.info("background task %s finished", spec.name)
                return
            now = time.monotonic()
            lived = now - spec.running_since
            spec.running_since = None
            spec.failed_at = now
            spec.restarts += 1
            if lived > self.settle_s:
                backoff = self.backoff_s  # it had been healthy: start over
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def down(self) -> list[str]:
        """Tasks that died and have not yet run ``settle_s`` since."""
        now = time.monotonic()
        return [
            s.name
            for s in self._tasks.values()
            if s.failed_at is not None
            and (s.running_since is None or now - s.running_since < self.settle_s)
        ]

    def restarts(self) -> dict[str, int]:
        return {s.name: s.restarts for s in self._tasks.values()}

    async def stop(self, *names: str) -> None:
        """Cancel the named tasks (all when none is named) and wait for them."""
        chosen = [self._tasks[n] for n in names] if names else list(self._tasks.values())
        for spec in chosen:
            if spec.task is not None:
                spec.task.cancel()
        for spec in chosen:
            if spec.task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await spec.task
                spec.task = None
