"""``/healthz``: the process is alive. ``/readyz``: it can serve — the database
answers and its schema is at the migration head this code expects."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from keyturn.db.migrate import current_revision, head_revision

_HEAD = head_revision()


async def healthz(request: Request) -> Response:
    runtime: Any = getattr(request.app.state, "runtime", None)
    if runtime is None:
        return JSONResponse({"status": "starting"}, status_code=503)
    return JSONResponse({"status": "ok", "owner": runtime.owner})


async def readyz(request: Request) -> Response:
    runtime: Any = getattr(request.app.state, "runtime", None)
    if runtime is None:
        return JSONResponse({"status": "starting"}, status_code=503)
    if not runtime.accepting:
        return JSONResponse({"status": "draining"}, status_code=503)
    try:
        async with asyncio.timeout(5):
            async with runtime.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            revision = await current_revision(runtime.engine)
    except Exception:
        return JSONResponse({"status": "database unavailable"}, status_code=503)
    if revision != _HEAD:
        return JSONResponse(
            {"status": "migrations behind", "revision": revision, "head": _HEAD}, status_code=503
        )
    return JSONResponse({"status": "ready", "revision": revision})
