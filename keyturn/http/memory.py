"""Giving memory back to the system once a large message is gone.

A WebSocket message of megabytes is read in pieces and joined; once its
connection is closed Python frees all of it, but the C allocator (glibc's)
keeps what it had grown, in the middle of its heap, for later: measured,
20 sockets that sent 480 MiB left the process 550 MiB larger after they
closed, with no object of them alive. ``malloc_trim`` returns those free
pages to the system. It takes a few milliseconds, so it runs at most once
per :data:`EVERY_S` (a trim asked for sooner is done when that time is up)
and only after a connection that received a large message; where the C
library has no such call (musl, macOS) only the collection below is done.

Not all of it is freed at the close, though: graphql-core's execution
context refers to itself (it keeps two of its own bound methods as the
helpers every resolve info carries), so each operation's variables, a 6 MiB string among them, live
in a reference cycle until Python's oldest generation is next collected,
which after a burst can be many minutes. Measured: 40 such cycles, 230 MiB,
still there ten seconds after the last close. So a cycle collection comes
first (a few milliseconds with the start-up objects frozen, see app.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

EVERY_S = 1.0
# Smaller messages come from the allocator's small-object pools, which give
# their memory back on their own.
LARGE_MESSAGE_BYTES = 256 * 1024
# In a WebSocket's scope state once it has received a large message.
_RECEIVED_LARGE = "keyturn.received_large"


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _load_trim()
_last = 0.0
_pending: asyncio.TimerHandle | None = None


def _trim() -> None:
    global _last
    _last = time.monotonic()
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


def _trailing() -> None:
    global _pending
    _pending = None
    _trim()


def give_back() -> None:
    """Return the allocator's free memory to the system: now, unless that was
    done less than :data:`EVERY_S` ago, and once more :data:`EVERY_S` after
    the last call. The second is for what is freed after the close: the
    connection's operation tasks end (and drop their messages) a moment
    later, later still on a busy machine, and the last of many connections
    closing at once must be given back too."""
    global _pending
    if time.monotonic() - _last >= EVERY_S:
        _trim()
    if _pending is not None:
        _pending.cancel()
    _pending = asyncio.get_running_loop().call_later(EVERY_S, _trailing)


def note_received(scope: MutableMapping[str, Any], size: int) -> None:
    """A WebSocket's message of ``size`` bytes was received (a mark in its
    scope only for a large one, so a connection of small messages keeps
    nothing for this)."""
    if size >= LARGE_MESSAGE_BYTES:
        scope.setdefault("state", {})[_RECEIVED_LARGE] = True


def received_large(scope: Mapping[str, Any]) -> bool:
    """Whether :func:`note_received` saw a large message on this WebSocket."""
    return bool(scope.get("state", {}).get(_RECEIVED_LARGE))
