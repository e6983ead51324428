"""What a handler's failure looks like in the worker's log (issue 44, item 3)."""

from __future__ import annotations

import logging

import pytest
from tests.helpers import FAST, wait_for_state

import awa
from awa.telemetry import joblog


async def test_a_failing_handler_logs_its_message_first_line_and_where_to_look(
        client: awa.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    @client.task(kind="welcome", queue="q")
    async def welcome(job: awa.Job) -> object:
        if job.args["n"] == 1:
            raise AttributeError("'NoneType' object has no attribute 'email'\nsecond line")
        if job.args["n"] == 2:
            raise ValueError("x" * 1000)
        return awa.RetryAfter(0.05) if job.attempt == 1 else None

    first = await client.insert({"n": 1}, kind="welcome", queue="q", max_attempts=2)
    long = await client.insert({"n": 2}, kind="welcome", queue="q", max_attempts=1)
    later = await client.insert({"n": 3}, kind="welcome", queue="q", max_attempts=3)
    caplog.set_level(logging.INFO, logger="awa.jobs")
    await client.start([("q", 4)], **FAST)
    try:
        await wait_for_state(client, first.id, awa.JobState.Failed, timeout=20)
        await wait_for_state(client, long.id, awa.JobState.Failed)
        await wait_for_state(client, later.id, awa.JobState.Completed)
    finally:
        await client.shutdown()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "awa.jobs"]
    assert ("WARNING", f"job {first.id} (kind=welcome queue=q attempt=1/2) raised "
                       "AttributeError: 'NoneType' object has no attribute 'email'; "
                       f"retrying (details: awa job dump {first.id})") in lines
    assert not any("second line" in m for _, m in lines)
    [cut] = [m for _, m in lines if m.startswith(f"job {long.id} ")]
    assert "failed for good (ValueError: xxx" in cut and "…, attempts used up" in cut
    assert len(cut) < joblog.MESSAGE_MAX_CHARS + 150
    # RetryAfter is what the handler asked for: no "raised error", no warning
    assert ("INFO", f"job {later.id} (kind=welcome queue=q attempt=1/3) asked to retry "
                    "later (RetryAfter)") in lines
    assert not any(m.startswith(f"job {later.id} ") for lvl, m in lines if lvl != "INFO")


def test_messages_can_be_kept_out_of_logs_by_setting_or_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert joblog.log_error_messages()
    monkeypatch.setenv("AWA_LOG_ERROR_MESSAGES", "0")
    assert not joblog.log_error_messages()
    awa.set_log_error_messages(True)
    try:
        assert joblog.log_error_messages()
    finally:
        awa.set_log_error_messages(None)
    with pytest.raises(awa.ValidationError, match="log_error_messages"):
        awa.set_log_error_messages("no")  # type: ignore[arg-type]
