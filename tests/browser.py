"""Browser-test support: the ``page`` fixture (a real headless Chromium, Debian's
``chromium`` package) and small helpers. Tests using ``page`` skip, with the
reason, when Chromium or Playwright is missing; nothing is downloaded."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import ROOT

CHROMIUM = os.environ.get("AWA_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
#: Flags that keep Chromium off the network it cannot reach here.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / "build" / "ui-screenshots"


@pytest.fixture
async def page() -> AsyncIterator[Any]:
    """A fresh page; confirm() prompts say yes; any JavaScript error fails the test."""
    playwright_api = pytest.importorskip("playwright.async_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("no Chromium: apt-get install chromium (or set AWA_CHROMIUM)")
    async with playwright_api.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        pg = await context.new_page()
        pg.on("dialog", lambda d: d.accept())
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        yield pg
        await browser.close()
        assert errors == [], f"JavaScript errors: {errors}"


def shot(name: str) -> Path:
    """Where the screenshot ``name`` goes (listed at the end of the test run)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS / f"{name}.png"


async def open_view(page: Any, url: str, view: str) -> None:
    """Navigate and wait until the view has rendered its data."""
    await page.goto(url)
    await page.wait_for_selector(f'main[data-view="{view}"]')
