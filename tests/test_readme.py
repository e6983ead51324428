"""The README works as written: its quick start is examples/quickstart.py and
runs, its links and images resolve, and it stays a front page.

The screenshot (docs/img/ui-dashboard.png) is the browser tests' dashboard
shot: run ``pytest tests/test_ui_browser.py -k test_every_page_with_real_data``
with Debian's chromium installed and copy ``build/ui-screenshots/dashboard.png``.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers import ROOT, SUBPROCESS_PATH

README = ROOT / "README.md"
QUICKSTART = ROOT / "examples" / "quickstart.py"
SCREENSHOT = ROOT / "docs" / "img" / "ui-dashboard.png"
#: Every page a newcomer follows from the README.
PAGES = [README, ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guide").glob("*.md")),
         ROOT / "bench" / "README.md"]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _code_blocks(text: str, language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang == language]


def _without_code(text: str) -> str:
    """The Markdown outside fenced blocks and inline code (links there are examples)."""
    text = _FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_starts_with_the_two_set_up_commands() -> None:
    lines = README.read_text().splitlines()
    head = "\n".join(lines[:10])
    assert "examples/demo.py" in head and "-m pytest" in head
    venv = "    python3 -m venv .venv && .venv/bin/pip install -e "
    assert lines[4].startswith(venv + "'.[embedded]'") and lines[4].endswith("examples/demo.py")
    assert lines[8].startswith(venv + "'.[dev]'") and lines[8].endswith("-m pytest")
    assert len(lines) < 200, "the README is a front page: move detail to docs/guide"


def test_the_quick_start_is_examples_quickstart_verbatim() -> None:
    blocks = _code_blocks(README.read_text(), "python")
    assert blocks, "the README has no ```python block"
    assert blocks[0].strip() == QUICKSTART.read_text().strip()


async def test_the_quick_start_runs_as_written(database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": SUBPROCESS_PATH}
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(QUICKSTART)], env=env, cwd=QUICKSTART.parent,
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["order 1 shipped on attempt 1"], proc.stdout
    assert "order 1 shipped on attempt 1" in README.read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_without_code(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


def test_the_readme_shows_the_ui_screenshot() -> None:
    assert "](docs/img/ui-dashboard.png)" in README.read_text()
    data = SCREENSHOT.read_bytes()
    assert data.startswith(b"\x89PNG"), "not a PNG"
    assert len(data) < 300_000, "keep the screenshot small"
