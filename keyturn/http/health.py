"""``/healthz``: the process is alive. ``/readyz``: it can serve — the database
answers, its schema is at the migration head this code expects, and every
background task of the process is up."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from keyturn.db import probes
from keyturn.db.engine import connect
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
    down = runtime.supervisor.down()
    if down:
        return JSONResponse({"status": "background tasks down", "down": down}, status_code=503)
    try:
        async with asyncio.timeout(5):
            async with connect(runtime.engine) as conn:
                await probes.ping(conn)
            revision = await current_revision(runtime.engine)
    except Exception:
        return JSONResponse({"status": "database unavailable"}, status_code=503)
    if revision != _HEAD:
        return JSONResponse(
            {"status": "migrations behind", "revision": revision, "head": _HEAD}, status_code=503
        )
    return JSONResponse({"status": "ready", "revision": revision})
