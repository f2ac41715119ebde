"""Waiting for an :class:`asyncio.Event` with a time limit."""

from __future__ import annotations

import asyncio


async def set_within(event: asyncio.Event, seconds: float) -> bool:
    """Whether ``event`` is set within ``seconds``.

    ``asyncio.timeout``, not ``wait_for``: on Python 3.11, ``wait_for``
    returns the event when a cancel lands in the same step of the loop, and
    the cancel is lost; a loop that waits this way would then never stop."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True
