"""Serving a folder's listed files, and nothing else, over HTTP only.

The playground and GraphiQL ship as folders that also hold their build
inputs (package.json, node_modules, build scripts); each is served through
a :class:`ListedFiles` with its own rule for which paths are its files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from starlette.responses import PlainTextResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send


class ListedFiles(StaticFiles):
    def __init__(self, *, directory: Path, served: Callable[[str], bool], html: bool = False):
        super().__init__(directory=directory, html=html)
        self.served = served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1000})
            return
        await super().__call__(scope, receive, send)

    async def get_response(self, path: str, scope: Scope) -> Response:
        if not self.served(path):
            return PlainTextResponse("Not Found", status_code=404)
        return await super().get_response(path, scope)


async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """What a mount answers when its files are missing or switched off."""
    if scope["type"] != "http":
        await send({"type": "websocket.close", "code": 1000})
        return
    await PlainTextResponse("Not Found", status_code=404)(scope, receive, send)
