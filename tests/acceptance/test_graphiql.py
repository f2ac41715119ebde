"""GraphiQL at GET /graphql in headless Chromium, with every other host cut off.

The page, its scripts and styles come from the server itself: the editor
renders, runs a mutation and a query over HTTP and a subscription over the
WebSocket, and no request leaves for another host. Screenshots go to
test-artifacts/graphiql/.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, BrowserContext, Page, Route, expect

from tests.support import ROOT, GraphQLClient, ServerProcess, start_server_process, stop_process

pytestmark = pytest.mark.slow

LIVE = 15_000  # ms to wait for the page or the server
QUERY_EDITOR = ".graphiql-query-editor .CodeMirror"
VARIABLES_EDITOR = ".graphiql-editor-tool .CodeMirror"
RESULT = ".graphiql-response .CodeMirror"
TOKEN_KEY = "keyturn.playground.token"  # the playground's; GraphiQL shares it


@pytest.fixture
def shots(artifacts: Path) -> Path:
    folder = artifacts / "graphiql"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture
def live_server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_server_process(database_url, tmp_path, name="graphiql")
    try:
        yield server
    finally:
        stop_process(server)


class Offline:
    """A browser context that reaches 127.0.0.1 only, and remembers what else
    the page tried; with every console error and page error."""

    def __init__(self, context: BrowserContext) -> None:
        self.context = context
        self.blocked: list[str] = []
        self.sockets: list[str] = []
        self.problems: list[str] = []

    async def route(self, route: Route) -> None:
        if urllib.parse.urlsplit(route.request.url).hostname == "127.0.0.1":
            await route.continue_()
        else:
            self.blocked.append(route.request.url)
            await route.abort("internetdisconnected")

    async def new_page(self) -> Page:
        page = await self.context.new_page()
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        page.on(
            "console",
            lambda msg: (
                self.problems.append(f"console {msg.type}: {msg.text}")
                if msg.type == "error"
                else None
            ),
        )
        page.on("websocket", lambda socket: self.sockets.append(socket.url))
        return page


@pytest.fixture
async def offline(browser: Browser) -> AsyncIterator[Offline]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    watched = Offline(context)
    await context.route("**/*", watched.route)
    try:
        yield watched
    finally:
        await context.close()


async def editor_text(page: Page, selector: str) -> str:
    text: str = await page.locator(selector).first.evaluate("el => el.CodeMirror.getValue()")
    return text


async def run(page: Page, name: str, document: str, variables: str | None = None) -> Any:
    """Put a named operation (and variables) into the editors, run it with
    Ctrl-Enter as a person would, and return its result's data."""
    await page.locator(QUERY_EDITOR).evaluate(
        "(el, text) => el.CodeMirror.setValue(text)", document
    )
    if variables is not None:
        await page.locator(VARIABLES_EDITOR).first.evaluate(
            "(el, text) => el.CodeMirror.setValue(text)", variables
        )
    await page.locator(RESULT).evaluate("el => el.CodeMirror.setValue('')")
    # GraphiQL reads the operation from the editor after a short debounce; the
    # tab's title shows when it has.
    await expect(page.locator(".graphiql-tab-active")).to_have_text(name)
    await page.locator(QUERY_EDITOR).click()
    await page.keyboard.press("Control+Enter")
    await expect(page.locator(RESULT)).to_contain_text('"data"', timeout=LIVE)
    body = json.loads(await editor_text(page, RESULT))
    assert "errors" not in body, body
    return body["data"]


async def open_graphiql(page: Page, url: str) -> None:
    await page.goto(url)
    await expect(page.locator(QUERY_EDITOR)).to_be_visible(timeout=LIVE)


async def test_graphiql_renders_and_runs_operations_with_no_other_host(
    offline: Offline, live_server: ServerProcess, shots: Path
) -> None:
    page = await offline.new_page()
    await open_graphiql(page, live_server.url + "/graphql")
    assert await page.title() == "Keyturn · GraphiQL"
    # With nothing in the address, the example operations and their variables.
    examples = await editor_text(page, QUERY_EDITOR)
    for name in ("mutation CreateSession", "mutation Submit", "query SessionEvents"):
        assert name in examples
    assert "subscription TurnCompleted" in examples
    assert '"sessionId"' in await editor_text(page, VARIABLES_EDITOR)
    await page.screenshot(path=shots / "1-examples.png")

    created = await run(page, "NewSession", "mutation NewSession { createSession { id } }")
    session_id = created["createSession"]["id"]
    submitted = await run(
        page,
        "Submit",
        """mutation Submit($sessionId: ID!, $key: String!, $input: String!) {
  submitTurn(input: { sessionId: $sessionId, idempotencyKey: $key, input: $input }) {
    ... on TurnAdmission { turn { id } }
  }
}""",
        json.dumps({"sessionId": session_id, "key": "graphiql-1", "input": "hello graphiql"}),
    )
    turn_id = submitted["submitTurn"]["turn"]["id"]

    # Over the WebSocket: the turn once it has ended.
    completed = await run(
        page,
        "Done",
        f'subscription Done {{ turnCompleted(turnId: "{turn_id}") {{ id status output }} }}',
    )
    assert completed["turnCompleted"]["id"] == turn_id
    assert completed["turnCompleted"]["status"] == "COMPLETED"
    assert offline.sockets == [live_server.ws_url]
    await page.screenshot(path=shots / "2-subscription.png")

    # The playground's link: ?q=…&variables=… fills the editors.
    document = "query Session($sessionId: ID!) {\n  session(id: $sessionId) { id eventCount }\n}"
    variables = json.dumps({"sessionId": session_id})
    query = urllib.parse.urlencode({"q": document, "variables": variables})
    await open_graphiql(page, f"{live_server.url}/graphql?{query}")
    assert await editor_text(page, QUERY_EDITOR) == document
    assert await editor_text(page, VARIABLES_EDITOR) == variables
    await page.locator(".graphiql-execute-button").click()
    await expect(page.locator(RESULT)).to_contain_text(session_id, timeout=LIVE)
    body = json.loads(await editor_text(page, RESULT))
    assert body["data"]["session"] == {"id": session_id, "eventCount": 4}
    await page.screenshot(path=shots / "3-linked-query.png")

    assert offline.blocked == []
    assert offline.problems == []


async def test_graphiql_uses_the_token_saved_in_this_browser(
    offline: Offline, database_url: str, tmp_path: Path
) -> None:
    from keyturn.db.engine import create_engine
    from keyturn.runtime.auth import create_token

    server = start_server_process(database_url, tmp_path, name="graphiql-auth")
    try:
        engine = create_engine(database_url, pool_size=1)
        try:
            secret = await create_token(engine, name="graphiql")
        finally:
            await engine.dispose()
        page = await offline.new_page()
        await page.goto(server.url + "/graphql")
        await expect(page.locator(QUERY_EDITOR)).to_be_visible(timeout=LIVE)
        refused = await page.evaluate(
            """async () => (await fetch("/graphql", {
                 method: "POST", headers: {"content-type": "application/json"},
                 body: JSON.stringify({query: "{ __typename }"})})).status"""
        )
        assert refused == 401  # this server does need the token
        await page.evaluate(
            "([key, value]) => localStorage.setItem(key, value)", [TOKEN_KEY, secret]
        )

        created = await run(page, "NewSession", "mutation NewSession { createSession { id } }")
        session_id = created["createSession"]["id"]
        client = GraphQLClient(server.url)
        client.http.headers["authorization"] = f"Bearer {secret}"
        try:
            admitted = await client.submit(session_id, "graphiql-token", "with a token")
        finally:
            await client.close()
        turn_id = admitted["turn"]["id"]
        completed = await run(
            page,
            "Done",
            f'subscription Done {{ turnCompleted(turnId: "{turn_id}") {{ id status }} }}',
        )
        assert completed["turnCompleted"] == {"id": turn_id, "status": "COMPLETED"}
    finally:
        stop_process(server)
    assert offline.blocked == []
    # The 401 above, on purpose.
    assert [p for p in offline.problems if "401" not in p] == []


async def test_graphiql_serves_its_bundle_only_and_switches_off(
    live_server: ServerProcess, database_url: str, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as http:
        page = await http.get("/graphql", headers={"accept": "text/html"})
        assert page.status_code == 200
        assert "graphiql/vendor/graphiql.js" in page.text
        assert "unpkg.com" not in page.text
        for path in ("/graphiql/vendor/graphiql.js", "/graphiql/vendor/graphiql.css"):
            assert (await http.get(path)).status_code == 200, path
        for path in (
            "/graphiql/index.html",
            "/graphiql/main.js",
            "/graphiql/package.json",
            "/graphiql/build.mjs",
            "/graphiql/node_modules/graphiql/package.json",
        ):
            assert (await http.get(path)).status_code == 404, path

    off = start_server_process(
        database_url, tmp_path, env={"KEYTURN_GRAPHIQL": "false"}, name="graphiql-off"
    )
    try:
        async with httpx.AsyncClient(base_url=off.url, timeout=10) as http:
            page = await http.get("/graphql", headers={"accept": "text/html"})
            assert page.status_code == 404
            assert (await http.get("/graphiql/vendor/graphiql.js")).status_code == 404
    finally:
        stop_process(off)


def test_an_installed_wheel_carries_graphiql(tmp_path: Path) -> None:
    source = tmp_path / "src"
    skip = shutil.ignore_patterns("node_modules", "__pycache__", "*.egg-info", "build")
    for name in ("keyturn", "playground", "graphiql"):
        shutil.copytree(ROOT / name, source / name, ignore=skip)
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", "dist"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("keyturn-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    inside = sorted(n for n in names if n.startswith("keyturn/graphiql_assets/"))
    assert inside == [
        "keyturn/graphiql_assets/index.html",
        "keyturn/graphiql_assets/vendor/graphiql.css",
        "keyturn/graphiql_assets/vendor/graphiql.js",
    ]
