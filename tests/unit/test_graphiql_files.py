"""GraphiQL's files: what is served, what the wheel carries, and that the page
names no other host."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import httpx
import pytest
from graphql import OperationDefinitionNode, parse, validate
from starlette.applications import Starlette
from starlette.responses import FileResponse

from keyturn.http.graphiql import (
    SERVED_FILES,
    SOURCE,
    graphiql_dir,
    graphiql_mount,
    is_served,
    page_response,
)
from keyturn.schema import schema
from tests.support import ROOT


def test_setup_py_copies_the_same_files_the_server_serves() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text())
    assigned = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert ast.literal_eval(assigned["GRAPHIQL_FILES"]) == SERVED_FILES


def test_a_source_checkout_serves_the_graphiql_folder() -> None:
    assert graphiql_dir() == SOURCE == ROOT / "graphiql"


def test_every_file_the_page_loads_is_a_served_bundle_file() -> None:
    html = (SOURCE / "index.html").read_text()
    wanted = re.findall(r'(?:src|href)="([^"#]+)"', html)
    files = [w for w in wanted if not w.startswith("data:")]
    # Relative to /graphql, where the page is answered: /graphiql/vendor/….
    assert sorted(files) == ["graphiql/vendor/graphiql.css", "graphiql/vendor/graphiql.js"]
    for name in files:
        inner = name.removeprefix("graphiql/")
        assert (SOURCE / inner).is_file(), name
        assert is_served(inner), name


def test_the_bundle_loads_nothing_from_another_host() -> None:
    html = (SOURCE / "index.html").read_text()
    script = (SOURCE / "vendor" / "graphiql.js").read_text()
    css = (SOURCE / "vendor" / "graphiql.css").read_text()
    for text in (html, script, css):
        assert "unpkg.com" not in text
        assert "cdn.jsdelivr" not in text
    assert "@import" not in css
    assert re.findall(r"url\((?!data:)[^)]*\)", css) == []  # fonts and icons are inline


@pytest.mark.parametrize(
    "path",
    [
        "index.html",  # answered at /graphql, where its relative links resolve
        "main.js",
        "package.json",
        "package-lock.json",
        "build.mjs",
        "node_modules/graphiql/package.json",
        "vendor/../package.json",
        "vendor/other.js",
        "vendor",
        "",
        "../keyturn/http/app.py",
    ],
)
def test_nothing_else_is_served(path: str) -> None:
    assert not is_served(path)


def client(enabled: bool) -> httpx.AsyncClient:
    app = Starlette(routes=[graphiql_mount(enabled)])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_the_mount_serves_the_bundle_and_refuses_the_rest() -> None:
    async with client(True) as http:
        script = await http.get("/graphiql/vendor/graphiql.js")
        assert script.status_code == 200
        assert "javascript" in script.headers["content-type"]
        css = await http.get("/graphiql/vendor/graphiql.css")
        assert css.headers["content-type"].startswith("text/css")
        for path in ("/graphiql/package.json", "/graphiql/main.js", "/graphiql/index.html"):
            assert (await http.get(path)).status_code == 404, path


async def test_with_graphiql_switched_off_the_bundle_is_not_served() -> None:
    async with client(False) as http:
        assert (await http.get("/graphiql/vendor/graphiql.js")).status_code == 404


def test_get_graphql_answers_the_local_page() -> None:
    response = page_response()
    assert isinstance(response, FileResponse)
    assert response.media_type == "text/html"
    assert Path(response.path) == SOURCE / "index.html"


def test_the_example_operations_are_valid_against_the_schema() -> None:
    source = (SOURCE / "main.js").read_text()
    found = re.search(r"const EXAMPLES = `(.*?)`;", source, re.DOTALL)
    assert found is not None
    document = parse(found.group(1))
    names = [
        d.name.value
        for d in document.definitions
        if isinstance(d, OperationDefinitionNode) and d.name
    ]
    assert names == ["CreateSession", "Submit", "SessionEvents", "TurnCompleted"]
    assert validate(schema._schema, document) == []
