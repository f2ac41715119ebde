"""Fairness between tenants: at most N GraphQL operations of one tenant run
at once in a process, and they hold at most N connections of the requests'
pool at once (one less than the pool, if N is not), so that one tenant's
flood of legal reads, or one request of many aliased fields, cannot take
every connection of the pool while other tenants wait.

What holds a slot: an HTTP request, from the moment it passes the Guard
(which names its tenant) until its answer starts, and a query or mutation
sent over a WebSocket, from its ``subscribe`` message until its result is
sent; both count against the same limit (:class:`Shares`), so one socket
with many operations is no way around it. A subscription holds no slot (over
HTTP its answer starts at once; over a WebSocket it is not counted): while
it waits for events it holds no connection. The next operations of a tenant
at its limit wait their turn, in order, for at most ``wait_s``; one that
waits longer, or finds :data:`QUEUE_PER_SLOT` per slot already waiting, is
answered ``UNAVAILABLE`` (retryable; over HTTP a 503 with ``Retry-After``)
and never runs.
While it holds its slot, an operation's checkouts count against its
tenant's connections (:mod:`keyturn.db.tenancy`): graphql-core runs a
query's root fields at once, each on a connection of its own, and those
beyond the tenant's N wait for one of its connections to come back. The
same N as the operations': a tenant whose operations take one connection
each never waits for one (N below the pool), and the default N, half the
pool, leaves the other half to the other tenants. A field that waits longer than
``pool_timeout_s`` for its connection is answered ``UNAVAILABLE``, as one
that finds the pool full is.
An open server (no tokens) has one tenant, "", and nobody else to be fair
to: its requests are not counted.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keyturn.db.tenancy import ConnectionShares, counted
from keyturn.http.media import response_media_type

# Waiting requests hold no connection, only their buffered bodies: the queue
# takes a client's ordinary burst (a hundred parallel requests of one page)
# and the wait, not the queue, is what turns a flood away.
QUEUE_PER_SLOT = 32


class _Share:
    """One tenant's running requests and the ones waiting for a slot."""

    __slots__ = ("running", "waiting")

    def __init__(self) -> None:
        self.running = 0
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    def idle(self) -> bool:
        return self.running == 0 and not self.waiting

    def leave(self) -> None:
        # The slot goes to the oldest waiter still waiting, or is freed.
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.running -= 1


class Shares:
    """Every tenant's slots in this process, for HTTP requests and WebSocket
    operations alike, and the connections their operations hold."""

    def __init__(self, *, limit: int, wait_s: float) -> None:
        self.limit = limit
        self.connections = ConnectionShares(limit=limit)
        self.queue = limit * QUEUE_PER_SLOT
        self.wait_s = wait_s
        self._shares: dict[str, _Share] = {}

    async def enter(self, tenant: str) -> bool:
        """Take one of ``tenant``'s slots, waiting in order for at most
        ``wait_s``; False (and nothing held) when none came free."""
        share = self._shares.setdefault(tenant, _Share())
        entered = False
        try:
            entered = await self._enter(share)
        finally:
            if not entered:
                self._forget_if_idle(tenant, share)
        return entered

    def leave(self, tenant: str) -> None:
        """Give back a slot :meth:`enter` took."""
        share = self._shares[tenant]
        share.leave()
        self._forget_if_idle(tenant, share)

    async def _enter(self, share: _Share) -> bool:
        if share.running < self.limit and not share.waiting:
            share.running += 1
            return True
        if len(share.waiting) >= self.queue:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        share.waiting.append(waiter)
        try:
            async with asyncio.timeout(self.wait_s):
                await waiter
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                return True  # the slot was handed over as the wait ran out
            _discard(share, waiter)
            return False
        except asyncio.CancelledError:
            # The client left while waiting: a slot handed over meanwhile
            # goes on to the next waiter.
            if waiter.done() and not waiter.cancelled():
                share.leave()
            else:
                _discard(share, waiter)
            raise
        return True

    def _forget_if_idle(self, tenant: str, share: _Share) -> None:
        # Bounded memory: only tenants with requests in flight are kept.
        if share.idle() and self._shares.get(tenant) is share:
            del self._shares[tenant]


class Fairness:
    """The HTTP side of :class:`Shares`: a GraphQL request holds a slot until
    its answer starts."""

    def __init__(self, app: ASGIApp, *, shares: Shares) -> None:
        self.app = app
        self.shares = shares

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tenant = scope.get("state", {}).get("tenant") if scope["type"] == "http" else None
        if not tenant or scope["path"] != "/graphql":
            # Not a GraphQL request the Guard let through (a refusal it already
            # sent, a page, /metrics, a WebSocket: its operations are counted
            # one by one, by keyturn.http.protocol), or a server running open:
            # with no tokens there is one tenant and nobody to be fair to.
            await self.app(scope, receive, send)
            return
        if not await self.shares.enter(tenant):
            await _unavailable(scope, send)
            return
        held = True
        with counted(self.shares.connections, tenant) as claim:

            def release() -> None:
                nonlocal held
                if held:
                    held = False
                    # A subscription's answer starts at once: its reads, from
                    # now on, count against neither.
                    claim.end()
                    self.shares.leave(tenant)

            async def send_releasing(message: Message) -> None:
                if message["type"] == "http.response.start":
                    release()
                await send(message)

            try:
                await self.app(scope, receive, send_releasing)
            finally:
                release()


def _discard(share: _Share, waiter: asyncio.Future[Any]) -> None:
    try:
        share.waiting.remove(waiter)
    except ValueError:
        pass


# The shape of the Guard's refusals and of GraphQL's own errors: a retry
# (with the same idempotency key) may succeed once the tenant's earlier
# requests have been answered.
BUSY_ERROR: dict[str, Any] = {
    "message": "too many requests of this tenant at once; retry",
    "extensions": {"code": "UNAVAILABLE", "retryable": True},
}


async def _unavailable(scope: Scope, send: Send) -> None:
    body = orjson.dumps({"errors": [BUSY_ERROR]})
    accept = None
    for key, value in scope.get("headers", []):
        if key == b"accept":
            accept = value.decode("latin-1")
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", response_media_type(accept).encode()),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
