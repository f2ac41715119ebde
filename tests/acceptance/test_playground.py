"""The playground in headless Chromium, against a real ``keyturn serve`` and database.

The demo a person runs: submit, watch the turn complete live, reload, retry the
last submission (Replayed, same turn, no new events), then reuse the key for a
changed input (Conflict, nothing written). Screenshots go to
test-artifacts/playground/; readme-playground.png there is the README's picture
(docs/playground.png is a copy of it).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, Route, expect

from tests.support import ServerProcess, start_server_process, stop_process

pytestmark = pytest.mark.slow

LIVE = 15_000  # ms to wait for something the server pushes


@pytest.fixture
def shots(artifacts: Path) -> Path:
    folder = artifacts / "playground"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture
def live_server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_server_process(database_url, tmp_path, name="playground")
    try:
        yield server
    finally:
        stop_process(server)


def watch(page: Page) -> list[str]:
    """Page errors and console errors or warnings, as they happen."""
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on(
        "console",
        lambda msg: (
            problems.append(f"console {msg.type}: {msg.text}")
            if msg.type in ("error", "warning")
            else None
        ),
    )
    return problems


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    # Tests take their server before the page (pytest tears fixtures down in
    # reverse): a server stopped while its page is open leaves the page a
    # refused reconnection to report as a console error.
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    opened = await context.new_page()
    problems = watch(opened)
    yield opened
    await context.close()
    assert problems == []


async def open_playground(page: Page, url: str) -> None:
    await page.goto(url + "/")
    await expect(page.locator("body")).to_have_attribute("data-ready", "true")


async def record(db: Any, session_id: str) -> tuple[int, int]:
    """(turns, events) saved for the session, straight from the tables."""
    turns = await db.fetchval("SELECT count(*) FROM turns WHERE session_id = $1::uuid", session_id)
    events = await db.fetchval(
        "SELECT count(*) FROM events WHERE session_id = $1::uuid", session_id
    )
    return int(turns), int(events)


async def test_submit_reload_retry_replays_and_changed_input_conflicts(
    live_server: ServerProcess, page: Page, db: Any, shots: Path
) -> None:
    await open_playground(page, live_server.url)
    await page.get_by_role("button", name="New session").click()
    session_id_node = page.locator("#session-id")
    await expect(session_id_node).to_have_text(re.compile(r"^[0-9a-f-]{36}$"))
    session_id = await session_id_node.inner_text()
    await expect(page.locator("#session-default-history")).to_have_text("FULL")

    # Submit: Accepted at once, the completion arrives live.
    key = await page.get_by_label("Idempotency key").input_value()
    assert key
    await page.get_by_label("Input").fill("/sleep 1500 hello playground")
    await page.get_by_role("button", name="Submit turn").click()
    answer = page.locator("#answer")
    await expect(answer.locator("[data-role=kind]")).to_have_text("Accepted")
    await expect(answer.locator("[data-role=typename]")).to_have_text("TurnAccepted")
    turn_id = await answer.locator("[data-role=turn-id]").inner_text()
    status = answer.locator("[data-role=status]")
    assert await status.inner_text() in {"QUEUED", "RUNNING"}
    await expect(status).to_have_text("COMPLETED", timeout=LIVE)
    await expect(answer.locator("[data-role=output]")).to_have_text(
        "fixture reply to: /sleep 1500 hello playground\nhistory: FULL, no earlier turns"
    )
    counter = page.locator("#event-count")
    await expect(counter).to_have_text("4", timeout=LIVE)
    # The answer's "Events saved" and the counter are the same number.
    delta = answer.locator("[data-role=delta]")
    await expect(delta).to_have_text(
        "0 before the request, 4 now: +4 (turn.started, turn.running, turn.delta, turn.completed)"
    )
    await expect(delta).to_have_attribute("data-delta", "4")
    await expect(page.locator("#event-delta")).to_contain_text("Since the last request: +4")
    await expect(page.locator("#timeline > li")).to_have_count(4)
    await page.screenshot(path=shots / "1-accepted-completed.png", full_page=True)
    saved = await record(db, session_id)
    assert saved == (1, 4)

    # Reload: the last submission survives in localStorage; the retry replays.
    await page.reload()
    await expect(page.locator("body")).to_have_attribute("data-ready", "true")
    await expect(page.locator("#session-id")).to_have_text(session_id)
    await expect(counter).to_have_text("4")
    await expect(page.locator("#last-summary")).to_contain_text(key)
    await page.get_by_role("button", name="Retry last submission").click()
    await expect(answer.locator("[data-role=typename]")).to_have_text("TurnReplayed")
    await expect(answer.locator("[data-role=kind]")).to_have_text("Replayed")
    assert await answer.locator("[data-role=turn-id]").inner_text() == turn_id
    await expect(answer.locator("[data-role=same-turn]")).to_contain_text("yes")
    await expect(delta).to_have_attribute("data-delta", "0")
    await expect(delta).to_have_text("4 before the request, 4 now: nothing new")
    await expect(status).to_have_text("COMPLETED")
    await expect(counter).to_have_text("4")
    await page.screenshot(path=shots / "2-reloaded-retry-replayed.png", full_page=True)
    await page.set_viewport_size({"width": 1200, "height": 900})
    await page.evaluate("window.scrollTo(0, 0)")
    await page.screenshot(path=shots / "readme-playground.png", full_page=True)
    await page.set_viewport_size({"width": 1280, "height": 900})
    assert await record(db, session_id) == saved

    # The same key with a changed input: Conflict, nothing written.
    await page.get_by_role("button", name="Same key, changed input").click()
    await expect(answer.locator("[data-role=typename]")).to_have_text("IdempotencyConflict")
    await expect(answer.locator("[data-role=kind]")).to_have_text("Conflict")
    await expect(answer).to_contain_text(turn_id)
    await expect(answer.locator("[data-role=delta]")).to_have_attribute("data-delta", "0")
    await expect(counter).to_have_text("4")
    await expect(page.locator("#timeline > li")).to_have_count(4)
    await page.screenshot(path=shots / "3-changed-input-conflict.png", full_page=True)
    assert await record(db, session_id) == saved
    keys = await db.fetch(
        "SELECT idempotency_key FROM turns WHERE session_id = $1::uuid", session_id
    )
    assert [r["idempotency_key"] for r in keys] == [key]


# Every text the answer's output shows, and whether it was marked partial, as
# the page changes it (kept in the page, so no change is missed between looks).
OBSERVE_OUTPUT = """() => {
  window.outputsSeen = [];
  const answer = document.getElementById("answer");
  const look = () => {
    const out = answer.querySelector("[data-role=output]");
    if (!out) return;
    const seen = { text: out.textContent, partial: out.dataset.partial === "true" };
    const last = window.outputsSeen[window.outputsSeen.length - 1];
    if (!last || last.text !== seen.text || last.partial !== seen.partial) {
      window.outputsSeen.push(seen);
    }
  };
  new MutationObserver(look).observe(answer, {
    subtree: true, childList: true, characterData: true, attributes: true,
  });
}"""


async def test_a_streamed_answer_grows_live_and_reads_the_same_after_a_reload(
    live_server: ServerProcess, page: Page, db: Any, shots: Path
) -> None:
    await open_playground(page, live_server.url)
    await page.get_by_role("button", name="New session").click()
    await expect(page.locator("#session-id")).to_have_text(re.compile(r"^[0-9a-f-]{36}$"))
    await page.evaluate(OBSERVE_OUTPUT)
    await page.get_by_label("Input").fill("/stream 5 300")
    await page.get_by_role("button", name="Submit turn").click()
    answer = page.locator("#answer")
    output = answer.locator("[data-role=output]")
    await expect(output).to_have_attribute("data-partial", "true", timeout=LIVE)
    await page.screenshot(path=shots / "6-streaming.png", full_page=True)
    await expect(answer.locator("[data-role=status]")).to_have_text("COMPLETED", timeout=LIVE)
    full = "fixture reply to: /stream 5 300\nhistory: FULL, no earlier turns"
    await expect(output).to_have_text(full)
    await expect(output).not_to_have_attribute("data-partial", "true")
    seen: list[dict[str, Any]] = await page.evaluate("window.outputsSeen")
    partial = [s["text"] for s in seen if s["partial"]]
    # Before it completed the answer showed the text so far, growing.
    assert all(full.startswith(t) for t in partial), seen
    assert any(len(t) < len(full) for t in partial), seen
    assert [len(t) for t in partial] == sorted({len(t) for t in partial})
    deltas = await db.fetch(
        "SELECT data ->> 'text' AS text FROM events WHERE type = 'turn.delta' ORDER BY seq"
    )
    assert "".join(d["text"] for d in deltas) == full
    assert len(deltas) > 1
    delta_rows = page.locator("#timeline > li[data-type='turn.delta']")
    await expect(delta_rows).to_have_count(len(deltas))

    # After a reload the page reads the record again: the same text.
    await page.reload()
    await expect(page.locator("body")).to_have_attribute("data-ready", "true")
    await page.get_by_role("button", name="Retry last submission").click()
    await expect(answer.locator("[data-role=typename]")).to_have_text("TurnReplayed")
    await expect(output).to_have_text(full)
    await expect(delta_rows).to_have_count(len(deltas))


async def test_a_running_turn_is_cancelled_from_its_answer(
    live_server: ServerProcess, page: Page, db: Any
) -> None:
    await open_playground(page, live_server.url)
    await page.get_by_role("button", name="New session").click()
    await expect(page.locator("#session-id")).to_have_text(re.compile(r"^[0-9a-f-]{36}$"))
    await page.get_by_label("Input").fill("/stream 20 300")
    await page.get_by_role("button", name="Submit turn").click()
    answer = page.locator("#answer")
    output = answer.locator("[data-role=output]")
    await expect(output).to_have_attribute("data-partial", "true", timeout=LIVE)
    cancel = answer.get_by_role("button", name="Cancel turn")
    await expect(cancel).to_be_visible()
    await cancel.click()
    await expect(answer.locator("[data-role=status]")).to_have_text("CANCELLED", timeout=LIVE)
    await expect(cancel).to_be_hidden()
    turn_id = await answer.locator("[data-role=turn-id]").inner_text()
    row = await db.fetchrow(
        "SELECT status, output, cancel_reason FROM turns WHERE id = $1::uuid", turn_id
    )
    assert row["status"] == "CANCELLED"
    assert row["cancel_reason"] == "cancelled in the playground"
    # The answer shows the output recorded before it stopped, and no more.
    await expect(output).to_have_text(row["output"])
    full = "fixture reply to: /stream 20 300\nhistory: FULL, no earlier turns"
    assert full.startswith(row["output"]) and len(row["output"]) < len(full)
    await expect(page.locator("#timeline > li[data-type='turn.cancelled']")).to_have_count(1)


async def test_sessions_history_keyboard_timeline_and_narrow_window(
    live_server: ServerProcess, page: Page, db: Any, shots: Path
) -> None:
    await open_playground(page, live_server.url)
    picker = page.get_by_label("Pick a session")
    await expect(picker).to_contain_text("No sessions yet")

    # Keyboard only: type the input, then Enter in the key field submits; with
    # no session yet the page creates one (default FULL) first.
    await page.get_by_label("Input").focus()
    await page.keyboard.press("ControlOrMeta+a")
    await page.keyboard.type("first turn")
    await page.get_by_label("Idempotency key").focus()
    await page.keyboard.press("Enter")
    answer = page.locator("#answer")
    await expect(answer.locator("[data-role=typename]")).to_have_text("TurnAccepted")
    await expect(answer.locator("[data-role=status]")).to_have_text("COMPLETED", timeout=LIVE)
    first_session = await page.locator("#session-id").inner_text()

    # A second session whose default history is NONE; a turn may override it.
    await page.get_by_label("Default history").select_option("NONE")
    await page.get_by_role("button", name="New session").click()
    await expect(page.locator("#session-default-history")).to_have_text("NONE")
    await expect(page.locator("#history-default-hint")).to_have_text("(NONE)")
    second_session = await page.locator("#session-id").inner_text()
    assert second_session != first_session
    await expect(picker.locator("option")).to_have_count(2)
    await page.get_by_label("Input").fill("second turn")
    await page.get_by_role("radio", name="FULL", exact=True).check()
    await page.get_by_role("button", name="Submit turn").click()
    await expect(answer).to_contain_text('"second turn" · history FULL')
    await expect(answer.locator("[data-role=typename]")).to_have_text("TurnAccepted")
    # The reply names the setting: FULL, though this first turn has nothing before it.
    await expect(answer.locator("[data-role=output]")).to_have_text(
        "fixture reply to: second turn\nhistory: FULL, no earlier turns", timeout=LIVE
    )
    history = await db.fetchval(
        "SELECT history FROM turns WHERE session_id = $1::uuid", second_session
    )
    assert history == "FULL"
    # The session default, NONE: the reply says so, not "no earlier turns".
    await page.get_by_label("Input").fill("third turn")
    await page.get_by_role("radio", name="Session default").check()
    await page.get_by_role("button", name="Submit turn").click()
    await expect(answer).to_contain_text('"third turn" · history NONE')
    await expect(answer.locator("[data-role=output]")).to_have_text(
        "fixture reply to: third turn\nhistory: NONE", timeout=LIVE
    )

    # Pick the first session from the list: its record and timeline come back.
    await picker.select_option(first_session)
    await expect(page.locator("#session-id")).to_have_text(first_session)
    await expect(page.locator("#session-default-history")).to_have_text("FULL")
    await expect(answer).to_have_attribute("data-kind", "none")  # it was another session's
    await expect(page.locator("#event-count")).to_have_text("4")
    rows = page.locator("#timeline > li")
    await expect(rows).to_have_count(4)
    assert await rows.evaluate_all("rows => rows.map(r => r.dataset.type)") == [
        "turn.completed",
        "turn.delta",
        "turn.running",
        "turn.started",
    ]
    # Fold an event open from the keyboard.
    started = rows.filter(has_text="turn.started").locator("summary")
    await started.focus()
    await page.keyboard.press("Enter")
    data = rows.filter(has_text="turn.started").locator("pre")
    await expect(data).to_be_visible()
    await expect(data).to_contain_text('"idempotencyKey"')

    # GraphiQL, opened with the example operations and this session's id.
    link = page.get_by_role("link", name="GraphiQL with example operations")
    href = await link.get_attribute("href")
    assert href is not None and href.startswith("graphql?q=")
    target = await link.evaluate("a => a.href")
    assert first_session in httpx.URL(target).params["variables"]
    assert "mutation Submit" in httpx.URL(target).params["q"]
    async with httpx.AsyncClient(timeout=10) as http:
        graphiql = await http.get(target, headers={"accept": "text/html"})
    assert graphiql.status_code == 200 and "graphiql" in graphiql.text.lower()
    await page.screenshot(path=shots / "4-sessions-timeline.png", full_page=True)

    # A narrow window: one column, nothing wider than the screen.
    await page.set_viewport_size({"width": 380, "height": 800})
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0
    await expect(page.get_by_role("button", name="Retry last submission")).to_be_visible()
    await page.screenshot(path=shots / "5-narrow-window.png", full_page=True)


async def test_only_the_pages_own_files_are_served(live_server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as http:
        index = await http.get("/")
        assert index.status_code == 200
        assert "Keyturn playground" in index.text
        for path in ("/app.js", "/style.css", "/favicon.svg", "/vendor/graphql-ws.js"):
            assert (await http.get(path)).status_code == 200, path
        for path in ("/package.json", "/build.mjs", "/node_modules/graphql-ws/package.json"):
            assert (await http.get(path)).status_code == 404, path
        assert (await http.get("/healthz")).status_code == 200


async def test_with_api_tokens_the_page_says_none_is_set_or_it_was_refused_then_works(
    browser: Browser, database_url: str, tmp_path: Path, shots: Path
) -> None:
    from keyturn.db.engine import create_engine
    from keyturn.runtime.auth import create_token

    engine = create_engine(database_url, pool_size=1)
    try:
        server = start_server_process(database_url, tmp_path, name="playground-auth")
        secret = await create_token(engine, name="browser")
    finally:
        await engine.dispose()
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = await context.new_page()
        await page.goto(server.url + "/")
        token_box = page.locator("#token-box")
        await expect(token_box).to_have_attribute("open", "", timeout=LIVE)
        # No token set: the empty picker says why.
        picker = page.get_by_label("Pick a session")
        await expect(picker).to_contain_text("Needs an API token: none set")
        await expect(page.locator("#token-status")).to_contain_text("none is set")
        await page.screenshot(path=shots / "7-token-missing.png", full_page=True)

        # A token the server does not know: refused, which is not "needs a token".
        await page.get_by_label("Token (kept in this browser)").fill("kt_not-a-real-token")
        await page.get_by_role("button", name="Use token").click()
        await expect(page.locator("body")).to_have_attribute("data-ready", "true")
        await expect(picker).to_contain_text("Token refused: paste a valid one")
        await expect(picker).not_to_contain_text("Needs")
        await expect(page.locator("#token-status")).to_contain_text("Token refused")
        await expect(page.locator("#answer")).to_contain_text("Token refused")
        await expect(token_box).to_have_attribute("open", "")
        await page.screenshot(path=shots / "7-token-refused.png", full_page=True)

        await page.get_by_label("Token (kept in this browser)").fill(secret)
        await page.get_by_role("button", name="Use token").click()
        await expect(page.locator("body")).to_have_attribute("data-ready", "true")
        await page.get_by_role("button", name="New session").click()
        await page.get_by_label("Input").fill("with a token")
        await page.get_by_role("button", name="Submit turn").click()
        answer = page.locator("#answer")
        await expect(answer.locator("[data-role=typename]")).to_have_text("TurnAccepted")
        # Live delivery over the WebSocket carries the token too.
        await expect(answer.locator("[data-role=status]")).to_have_text("COMPLETED", timeout=LIVE)
        await expect(page.locator("#token-status")).to_have_text("")
        await page.screenshot(path=shots / "5-with-token.png", full_page=True)
    finally:
        await context.close()
        stop_process(server)


async def test_with_no_answer_from_the_server_the_key_is_kept_and_submit_again_is_safe(
    browser: Browser, live_server: ServerProcess, db: Any, shots: Path
) -> None:
    # Its own context: a refused connection is a console error here, by design.
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = await context.new_page()
        await open_playground(page, live_server.url)
        await page.get_by_role("button", name="New session").click()
        await expect(page.locator("#session-id")).to_have_text(re.compile(r"^[0-9a-f-]{36}$"))
        session_id = await page.locator("#session-id").inner_text()
        key = await page.get_by_label("Idempotency key").input_value()
        await page.get_by_label("Input").fill("through an outage")
        answer = page.locator("#answer")
        retry = page.get_by_role("button", name="Retry last submission")

        # The server is down: every request fails before it gets there.
        async def down(route: Route) -> None:
            await route.abort("connectionrefused")

        await page.route("**/graphql", down)
        await page.get_by_role("button", name="Submit turn").click()
        await expect(answer).to_contain_text("No answer from the server")
        safe = answer.locator("[data-role=safe-retry]")
        await expect(safe).to_contain_text(f"The key {key} is kept in this browser")
        await expect(safe).to_contain_text("pressing Submit again is a safe retry")
        await expect(retry).to_be_enabled()
        await expect(page.get_by_label("Idempotency key")).to_have_value(key)
        await page.screenshot(path=shots / "8-server-down.png", full_page=True)
        assert await record(db, session_id) == (0, 0)

        # The submission reaches the server but its answer is lost on the way back.
        async def answer_lost(route: Route) -> None:
            if "submitTurn" in (route.request.post_data or ""):
                await route.fetch()
                await route.abort("connectionreset")
            else:
                await route.continue_()

        await page.unroute("**/graphql", down)
        await page.route("**/graphql", answer_lost)
        await page.get_by_role("button", name="Submit turn").click()
        await expect(safe).to_contain_text("pressing Submit again is a safe retry")
        await expect(retry).to_be_enabled()
        turns = await db.fetchval(
            "SELECT count(*) FROM turns WHERE session_id = $1::uuid", session_id
        )
        assert turns == 1

        # Back up: Submit again answers with that turn, Replayed; no second turn.
        await page.unroute("**/graphql", answer_lost)
        await page.get_by_role("button", name="Submit turn").click()
        await expect(answer.locator("[data-role=typename]")).to_have_text("TurnReplayed")
        turn_id = await answer.locator("[data-role=turn-id]").inner_text()
        await expect(answer.locator("[data-role=status]")).to_have_text("COMPLETED", timeout=LIVE)
        await retry.click()
        await expect(answer.locator("[data-role=same-turn]")).to_contain_text("yes")
        assert await answer.locator("[data-role=turn-id]").inner_text() == turn_id
        await page.screenshot(path=shots / "8-server-back.png", full_page=True)
        rows = await db.fetch(
            "SELECT id::text, idempotency_key FROM turns WHERE session_id = $1::uuid", session_id
        )
        assert [(r["id"], r["idempotency_key"]) for r in rows] == [(turn_id, key)]
    finally:
        await context.close()


async def test_on_a_phone_the_answer_is_in_sight_without_scrolling(
    browser: Browser, live_server: ServerProcess, shots: Path
) -> None:
    context = await browser.new_context(
        viewport={"width": 375, "height": 667}, is_mobile=True, has_touch=True
    )
    try:
        page = await context.new_page()
        problems = watch(page)
        await open_playground(page, live_server.url)
        await page.get_by_label("Input").fill("from a phone")
        await page.get_by_role("button", name="Submit turn").click()
        answer = page.locator("#answer")
        await expect(answer.locator("[data-role=status]")).to_have_text("COMPLETED", timeout=LIVE)
        for role in ("kind", "status", "output"):
            await expect(answer.locator(f"[data-role={role}]")).to_be_in_viewport(ratio=1)
        await expect(answer.locator("[data-role=output]")).to_contain_text("from a phone")
        await page.screenshot(path=shots / "6-phone-accepted.png")

        # The retry buttons follow the answer; a retry's answer is in sight too.
        await page.get_by_role("button", name="Retry last submission").click()
        await expect(answer.locator("[data-role=kind]")).to_have_text("Replayed")
        for role in ("kind", "same-turn", "delta"):
            await expect(answer.locator(f"[data-role={role}]")).to_be_in_viewport(ratio=1)
        overflow = await page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0
        await page.screenshot(path=shots / "6-phone-replayed.png")
        assert problems == []
    finally:
        await context.close()
