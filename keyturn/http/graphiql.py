"""GraphiQL at ``GET /graphql``, from files that ship with the package.

Its files live in ``graphiql/`` at the top of the repository: ``index.html``
(the page, answered at ``/graphql``) and the bundle it loads from
``/graphiql/vendor/``. An installed wheel carries a copy in
``keyturn/graphiql_assets/`` (see ``setup.py``); a source checkout serves the
folder itself. Only those files are served, never ``package.json``,
``main.js`` or ``node_modules``.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from starlette.responses import FileResponse, Response
from starlette.routing import Mount

from keyturn.http.static import ListedFiles, not_found

# What the page is made of; setup.py copies the same files into the wheel.
SERVED_FILES = ("index.html", "vendor/graphiql.js", "vendor/graphiql.css")
PAGE = "index.html"
_PACKAGE = Path(__file__).resolve().parent.parent  # keyturn/
PACKAGED = _PACKAGE / "graphiql_assets"
SOURCE = _PACKAGE.parent / "graphiql"


def graphiql_dir() -> Path | None:
    """The folder to serve: the packaged copy, else the source checkout's."""
    for candidate in (PACKAGED, SOURCE):
        if all((candidate / name).is_file() for name in SERVED_FILES):
            return candidate
    return None


def is_served(path: str) -> bool:
    """Whether a path under ``/graphiql/`` names one of the bundle's files.

    The page itself is answered at ``/graphql`` only: its relative links
    resolve from there.
    """
    return path in SERVED_FILES and path != PAGE and ".." not in PurePosixPath(path).parts


def page_response() -> Response | None:
    """The page, or None when the files are missing (a wheel built without them)."""
    directory = graphiql_dir()
    if directory is None:
        return None
    # no-cache: a rebuilt bundle is picked up on the next load (ETag revalidates).
    return FileResponse(
        directory / PAGE, media_type="text/html", headers={"cache-control": "no-cache"}
    )


def graphiql_mount(enabled: bool) -> Mount:
    """Mount the bundle at ``/graphiql``; list it before the playground's catch-all.

    With GraphiQL switched off (``KEYTURN_GRAPHIQL=false``) every path answers 404.
    """
    directory = graphiql_dir() if enabled else None
    if directory is None:
        return Mount("/graphiql", app=not_found, name="graphiql")
    return Mount(
        "/graphiql", app=ListedFiles(directory=directory, served=is_served), name="graphiql"
    )
