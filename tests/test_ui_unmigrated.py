"""The web UI on a database with no Awa schema says to run `awa migrate` (issue 44)."""

from __future__ import annotations

import logging

import pytest
from tests.ui_helpers import call, serving

from awa.web.ui import ui_app

PAGES = ["config", "overview", "jobs", "jobs/1", "queues", "cron", "dlq", "runtime", "batches"]


async def test_every_page_on_an_unmigrated_database_says_run_awa_migrate(
        empty_database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    server_log = logging.getLogger("uvicorn.error")  # uvicorn's loggers do not propagate
    server_log.addHandler(caplog.handler)
    try:
        async with serving(ui_app(empty_database_url)) as base:
            for page in PAGES:
                status, body = await call(f"{base}/api/{page}")
                assert status == 503, (page, body)
                assert "run `awa migrate`" in body["error"], (page, body)
    finally:
        server_log.removeHandler(caplog.handler)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no tracebacks
