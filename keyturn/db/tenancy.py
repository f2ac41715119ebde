"""One tenant's share of the requests' pool: at most N connections of it are
held at once on behalf of one tenant's operations in a process.

The operations of a tenant are counted already (keyturn.http.fairness), but
one operation may take many connections at once: graphql-core runs a
query's root fields concurrently, and each (thirty aliases of one field, say)
checks out a connection of its own. The HTTP and WebSocket layers name the
tenant an operation runs for with :func:`counted`; :func:`keyturn.db.engine.connect`
reads :data:`CLAIM` (context variables are copied into the tasks graphql-core
gathers) and, for the requests' engine only, takes one of the tenant's
connections before it checks one out of the pool, and gives it back after.

Here rather than beside the operations' slots: the engine reads it, and the
database layer imports nothing from the layers above it.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class _Held:
    """One tenant's connections held now, and the checkouts waiting for one."""

    __slots__ = ("count", "waiting")

    def __init__(self) -> None:
        self.count = 0
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()


class ConnectionShares:
    """Every tenant's connections of the requests' pool in this process.

    A tenant is looked up at each checkout, never kept in the operation's
    context: a tenant with nothing held and nothing waiting is forgotten
    (bounded memory), and whichever operation of it comes next counts
    against the same one entry as every other."""

    def __init__(self, *, limit: int) -> None:
        self.limit = limit
        self._tenants: dict[str, _Held] = {}

    def held(self, tenant: str) -> int:
        """How many connections ``tenant`` holds now."""
        held = self._tenants.get(tenant)
        return held.count if held is not None else 0

    def waiting(self, tenant: str) -> int:
        """How many checkouts of ``tenant`` wait for one of its connections."""
        held = self._tenants.get(tenant)
        return sum(not w.done() for w in held.waiting) if held is not None else 0

    def try_acquire(self, tenant: str, *, cap: int) -> bool:
        """Take one of ``tenant``'s connections if one is free now and no
        checkout of the tenant waits before this one; False, and nothing
        held, otherwise."""
        held = self._tenants.get(tenant)
        if held is None:
            held = self._tenants[tenant] = _Held()
        if held.count < min(self.limit, cap) and not held.waiting:
            held.count += 1
            return True
        return False

    async def acquire(self, tenant: str, *, cap: int) -> None:
        """Take one of ``tenant``'s connections, at most ``min(limit, cap)``
        at once, waiting in order; the caller bounds the wait (cancelling
        it leaves nothing held)."""
        if self.try_acquire(tenant, cap=cap):
            return
        held = self._tenants[tenant]
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        held.waiting.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # Handed over just as the wait was cancelled: it goes on to
                # the next waiter.
                self.release(tenant)
            else:
                try:
                    held.waiting.remove(waiter)
                except ValueError:
                    pass
                self._forget_if_idle(tenant, held)
            raise

    def release(self, tenant: str) -> None:
        """Give back a connection :meth:`acquire` took: to the oldest waiter
        still waiting, or freed."""
        held = self._tenants[tenant]
        while held.waiting:
            waiter = held.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        held.count -= 1
        self._forget_if_idle(tenant, held)

    def _forget_if_idle(self, tenant: str, held: _Held) -> None:
        if held.count == 0 and not held.waiting and self._tenants.get(tenant) is held:
            del self._tenants[tenant]


class Claim:
    """An operation of ``tenant``: the connections taken in its context count
    against the tenant's share until it :meth:`end`\\ s. Ended, it counts
    nothing more, in whichever task still carries it (over HTTP a
    subscription's answer starts at once, and its reads then hold no slot
    and no share, as over a WebSocket)."""

    __slots__ = ("ended", "shares", "tenant")

    def __init__(self, shares: ConnectionShares, tenant: str) -> None:
        self.shares = shares
        self.tenant = tenant
        self.ended = False

    def end(self) -> None:
        self.ended = True


# The operation the current task works for; None outside a counted
# operation (the open server's, the worker's, the process's own tasks).
CLAIM: ContextVar[Claim | None] = ContextVar("keyturn_tenant_claim", default=None)


@contextmanager
def counted(shares: ConnectionShares, tenant: str) -> Iterator[Claim]:
    """Connections taken inside count against ``tenant``'s share."""
    claim = Claim(shares, tenant)
    token = CLAIM.set(claim)
    try:
        yield claim
    finally:
        claim.end()
        CLAIM.reset(token)
