"""Runtime failures → errors a client may see."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from keyturn.errors import DatabaseUnavailable, ShuttingDown
from keyturn.resolvers.errors import NotAdmitting, Unavailable


@asynccontextmanager
async def public_failures() -> AsyncIterator[None]:
    try:
        yield
    except DatabaseUnavailable as error:
        raise Unavailable(str(error)) from error
    except ShuttingDown as error:
        raise NotAdmitting() from error
