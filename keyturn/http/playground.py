"""The browser playground, served at ``/``.

Its files live in ``playground/`` at the top of the repository. An installed
wheel carries a copy in ``keyturn/playground_assets/`` (see ``setup.py``); a
source checkout serves the folder itself, so an edit shows on reload.
Only the page's own files are served, never ``package.json`` or
``node_modules``.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send

from keyturn.http.static import ListedFiles

# What the page is made of; setup.py copies the same patterns into the wheel.
SERVED_PATTERNS = ("*.html", "*.css", "*.js", "*.svg", "vendor/*.js")
_PACKAGE = Path(__file__).resolve().parent.parent  # keyturn/
PACKAGED = _PACKAGE / "playground_assets"
SOURCE = _PACKAGE.parent / "playground"


def playground_dir() -> Path | None:
    """The folder to serve: the packaged copy, else the source checkout's."""
    for candidate in (PACKAGED, SOURCE):
        if (candidate / "index.html").is_file():
            return candidate
    return None


def is_served(path: str) -> bool:
    """Whether a request path (relative, POSIX) names one of the page's files."""
    if path in ("", "."):
        return True  # the index
    parts = PurePosixPath(path).parts
    if ".." in parts:
        return False
    for pattern in SERVED_PATTERNS:
        wanted = pattern.split("/")
        if len(wanted) == len(parts) and all(map(fnmatchcase, parts, wanted)):
            return True
    return False


def playground_mount() -> Mount:
    """Mount the playground at ``/``; list it after every other route."""
    directory = playground_dir()
    if directory is None:
        return Mount("/", app=_missing, name="playground")
    return Mount(
        "/", app=ListedFiles(directory=directory, served=is_served, html=True), name="playground"
    )


async def _missing(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        await send({"type": "websocket.close", "code": 1000})
        return
    response = PlainTextResponse(
        "The playground's files are not installed; the API is at /graphql.", status_code=404
    )
    await response(scope, receive, send)
