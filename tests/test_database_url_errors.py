"""A wrong database URL says where it came from, in one line (issue 44, item 7)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests.helpers import ROOT, SUBPROCESS_PATH

import awa


def _awa(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "awa", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": SUBPROCESS_PATH, **env},
                          timeout=60)


def test_the_cli_names_database_url_as_the_source_of_a_bad_url() -> None:
    done = _awa("queue", "stats", env={"DATABASE_URL": "localhost:5432/app"})
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: $DATABASE_URL: must be a PostgreSQL URL such as "
        "postgresql://user:password@localhost:5432/dbname (got 'localhost:5432/app')")
    done = _awa("--database-url", "mysql://me:hunter2@db/app", "queue", "stats", env={})
    assert done.returncode == 1 and "error: --database-url: must be a PostgreSQL URL" in done.stderr
    assert "hunter2" not in done.stderr and "Traceback" not in done.stderr


def test_python_refuses_a_bad_url_when_the_client_is_made(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "localhost:5432/app")
    with pytest.raises(awa.ValidationError) as err:
        awa.AsyncClient()
    assert err.value.field == "$DATABASE_URL" and "got 'localhost:5432/app'" in str(err.value)
    with pytest.raises(awa.ValidationError, match=r"^database_url: must be a PostgreSQL URL") \
            as err:
        awa.Client("app:secret@localhost/app")
    assert "secret" not in str(err.value) and "app:***@localhost/app" in str(err.value)
