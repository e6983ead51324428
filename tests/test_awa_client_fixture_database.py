"""The ``awa_client`` fixture never cleans the database ``$DATABASE_URL`` names (issue 44)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
from tests.helpers import SUBPROCESS_PATH

import awa
from awa.testing import fixture_database_name

USER_TEST = '''
from urllib.parse import urlsplit

async def test_mine(awa_client):
    url = await awa_client.client.database_url()
    print("FIXTURE_DB", urlsplit(url).path)
    await awa_client.insert({"n": 1}, kind="mine")
    assert await awa_client.client.queue_stats()
'''


def test_a_dev_database_keeps_its_jobs_when_the_users_tests_run(
        database_url: str, tmp_path: Path) -> None:
    with awa.Client(database_url) as client:
        kept = client.insert({"precious": True}, kind="dev_data", queue="dev")
    (tmp_path / "test_mine.py").write_text(USER_TEST)
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": SUBPROCESS_PATH}
    env.pop("AWA_TEST_DATABASE_URL", None)
    own = fixture_database_name(urlsplit(database_url).path.lstrip("/"))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
             "-o", "asyncio_mode=auto", f"--rootdir={tmp_path}", str(tmp_path)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"FIXTURE_DB /{own}" in done.stdout
        with awa.Client(database_url) as client:
            assert client.get_job(kept.id).args == {"precious": True}
    finally:
        import asyncio

        async def drop() -> None:
            conn = await asyncpg.connect(database_url)
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{own}" WITH (FORCE)')
            finally:
                await conn.close()
        asyncio.run(drop())


@pytest.mark.parametrize(("name", "own"), [
    ("app", "app_awa_test"), ("My-App", "my_app_awa_test"), ("1st", "awa1st_awa_test"),
    ("x" * 63, "x" * 54 + "_awa_test")])
def test_the_fixtures_database_is_named_after_yours(name: str, own: str) -> None:
    assert fixture_database_name(name) == own
