"""The README's first command, examples/demo.py, runs any number of times (issue 44)."""

from __future__ import annotations

import os
import subprocess
import sys

import asyncpg
from tests.helpers import ROOT, SUBPROCESS_PATH


async def test_the_demo_runs_again_and_leaves_nothing_waiting(database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": SUBPROCESS_PATH}
    for run in (1, 2):
        done = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py")], env=env,
                              cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"run {run}: {done.stderr}"
        assert "duplicate refused" in done.stdout and "done in" in done.stdout
        assert "Traceback" not in done.stderr and "raised error" not in done.stderr
    conn = await asyncpg.connect(database_url)
    try:
        waiting = await conn.fetchval("SELECT count(*) FROM awa.jobs WHERE queue = 'demo'")
    finally:
        await conn.close()
    assert waiting == 0
