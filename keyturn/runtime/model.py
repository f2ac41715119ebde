"""The model seam, and the deterministic offline fixture that fills it.

A real model would implement :class:`Model`. The fixture gives the same output
for the same input and history, byte for byte, and understands a few
directives for tests and demos:

``/sleep MS``  hold the turn MS milliseconds, then reply
``/fail``      end the turn with ``turn.failed``
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass
from typing import Protocol

from keyturn.errors import KeyturnError


@dataclass(frozen=True, slots=True)
class PastTurn:
    input: str
    output: str | None
    status: str  # COMPLETED or INTERRUPTED


class ModelError(KeyturnError):
    """The model could not produce a reply."""


class Model(Protocol):
    async def reply(self, *, input: str, history: list[PastTurn]) -> str:
        """The reply to ``input`` given ``history``; raise ModelError to fail the turn."""
        ...


_SLEEP = re.compile(r"^/sleep\s+(\d{1,7})\b")


def _digest(history: list[PastTurn]) -> str:
    h = hashlib.sha256()
    for past in history:
        for part in (past.status, past.input, past.output or ""):
            h.update(part.encode())
            h.update(b"\x00")
    return h.hexdigest()[:12]


class FixtureModel:
    def __init__(self, *, delay_ms: int = 0) -> None:
        self.delay_ms = delay_ms

    async def reply(self, *, input: str, history: list[PastTurn]) -> str:
        delay = self.delay_ms
        match = _SLEEP.match(input)
        if match:
            delay += int(match.group(1))
        if delay:
            await asyncio.sleep(delay / 1000)
        if input.strip() == "/fail":
            raise ModelError("the fixture model was asked to fail (/fail)")
        lines = [f"fixture reply to: {input}"]
        if history:
            lines.append(f"history: {len(history)} earlier turn(s), digest {_digest(history)}")
            for n, past in enumerate(history, 1):
                mark = "" if past.status == "COMPLETED" else f" [{past.status.lower()}]"
                lines.append(f"  {n}. {past.input}{mark}")
        else:
            lines.append("history: none")
        return "\n".join(lines)
