"""Fixtures of the browser tests: Debian's Chromium driven by Playwright.

Playwright's own browser download does not work everywhere these tests run,
so the system's Chromium is launched (KEYTURN_TEST_CHROMIUM names another);
without one the tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, async_playwright

CHROMIUM = Path(os.environ.get("KEYTURN_TEST_CHROMIUM", "/usr/bin/chromium"))
# No sandbox (run as root), and none of the background traffic a closed
# network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def chromium() -> Path:
    if not CHROMIUM.exists():
        reason = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: the browser tests must run in CI")
        pytest.skip(reason)
    return CHROMIUM


@pytest.fixture
async def browser(chromium: Path) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            await launched.close()
