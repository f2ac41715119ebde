"""The playground's Approve and Reject buttons on a call that waits, in
headless Chromium against a real ``keyturn serve``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect

from tests.acceptance.test_playground import LIVE, open_playground, page
from tests.support import ServerProcess, start_server_process, stop_process

pytestmark = pytest.mark.slow

__all__ = ["page"]  # the fixture, shared with the playground's other tests


@pytest.fixture
def approving_server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_server_process(
        database_url, tmp_path, name="playground", env={"KEYTURN_APPROVE_UNSAFE": "true"}
    )
    try:
        yield server
    finally:
        stop_process(server)


@pytest.mark.parametrize(
    ("button", "state", "says"),
    [("Approve", "approved", '"applied": true'), ("Reject", "rejected", "refused by a person")],
)
async def test_a_waiting_call_is_decided_from_the_timeline(
    approving_server: ServerProcess, page: Page, db: Any, button: str, state: str, says: str
) -> None:
    await open_playground(page, approving_server.url)
    await page.get_by_role("button", name="New session").click()
    await expect(page.locator("#session-id")).to_have_text(re.compile(r"^[0-9a-f-]{36}$"))
    await page.get_by_label("Input").fill("/append x=1")
    await page.get_by_role("button", name="Submit turn").click()
    answer = page.locator("#answer")
    await expect(answer.locator("[data-role=status]")).to_have_text("WAITING", timeout=LIVE)
    request = page.locator("#timeline > li[data-type='tool.approval_requested']")
    await expect(request).to_have_count(1, timeout=LIVE)
    await request.get_by_role("button", name=button).click()
    await expect(request.locator("[data-role=decision-state]")).to_have_text(state, timeout=LIVE)
    await expect(request.get_by_role("button", name="Approve")).to_be_disabled()
    await expect(request.get_by_role("button", name="Reject")).to_be_disabled()
    await expect(answer.locator("[data-role=status]")).to_have_text("COMPLETED", timeout=LIVE)
    await expect(answer.locator("[data-role=output]")).to_contain_text(says)
    turn_id = await answer.locator("[data-role=turn-id]").inner_text()
    effects = await db.fetchval(
        "SELECT count(*) FROM synthetic_effects WHERE effect_key = $1", f"{turn_id}/0"
    )
    assert effects == (1 if button == "Approve" else 0)
