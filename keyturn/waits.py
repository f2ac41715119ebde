"""Waiting with a time limit, without losing a cancel.

``asyncio.timeout``, not ``wait_for``: on Python 3.11, ``wait_for`` returns
the awaited answer when a cancel lands in the same step of the loop, and the
cancel is lost. A loop that waits this way may then never stop, and a turn
whose tool answers as it is cancelled goes on to its next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(call: Awaitable[T], seconds: float) -> T:
    """``call``'s answer; TimeoutError if it takes longer than ``seconds``
    (the call is cancelled then)."""
    async with asyncio.timeout(seconds):
        return await call


async def set_within(event: asyncio.Event, seconds: float) -> bool:
    """Whether ``event`` is set within ``seconds``."""
    try:
        await within(event.wait(), seconds)
    except TimeoutError:
        return False
    return True
