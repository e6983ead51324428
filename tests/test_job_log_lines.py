"""What a handler's failure looks like in the worker's log (issue 44, item 3)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys

import pytest
from tests.helpers import FAST, ROOT, SUBPROCESS_PATH, wait_for_state

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


async def test_job_outcomes_that_need_attention_are_logged(
        client: awa.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    @client.task(kind="flaky", queue="q")
    async def flaky(job: awa.Job) -> None:
        raise ValueError(f"secret {job.args['secret']}")

    @client.task(kind="stuck", queue="q")
    async def stuck(job: awa.Job) -> None:
        await asyncio.sleep(30)

    awa.set_log_error_messages(False)  # messages may carry data that must not reach logs
    retried = await client.insert({"secret": "hunter2"}, kind="flaky", queue="q",
                                  max_attempts=2)
    timed_out = await client.insert({"secret": "hunter2"}, kind="stuck", queue="q",
                                    max_attempts=1)
    caplog.set_level(logging.INFO, logger="awa.jobs")
    await client.start([{"name": "q", "max_workers": 4, "deadline_duration_ms": 300}], **FAST)
    try:
        await wait_for_state(client, retried.id, awa.JobState.Failed, timeout=20)
        await wait_for_state(client, timed_out.id, awa.JobState.Failed)
    finally:
        await client.shutdown(timeout_ms=200)
        awa.set_log_error_messages(None)
    records = [r for r in caplog.records if r.name == "awa.jobs"]
    lines = [(r.levelname, r.getMessage()) for r in records]
    assert ("WARNING", f"job {retried.id} (kind=flaky queue=q attempt=1/2) raised ValueError; "
                       f"retrying (details: awa job dump {retried.id})") in lines
    assert ("ERROR", f"job {retried.id} (kind=flaky queue=q attempt=2/2) failed for good "
                     f"(ValueError, attempts used up; details: awa job dump {retried.id})") \
        in lines
    rescue = [m for lvl, m in lines if m.startswith(f"job {timed_out.id} ")]
    assert rescue and "rescued: hard deadline exceeded" in rescue[0]
    assert "failed for good" in rescue[0]
    assert {(r.job_id, r.kind, r.queue) for r in records} >= {  # type: ignore[attr-defined]
        (retried.id, "flaky", "q"), (timed_out.id, "stuck", "q")}
    assert not any("hunter2" in m for _, m in lines)  # args and messages stay out of logs


def test_awa_worker_logs_json(database_url: str) -> None:
    async def insert() -> int:
        async with awa.AsyncClient(database_url) as c:
            return (await c.insert({"x": 1}, kind="nobody_has_this", queue="procs")).id
    job_id = asyncio.run(insert())
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": SUBPROCESS_PATH}
    proc = subprocess.Popen(
        [sys.executable, "-m", "awa", "worker", "tests.apps.worker_app:client",
         "--queue", "procs=2", "--log-format", "json", "--log-level", "warning",
         *[f"--set={k}={v}" for k, v in FAST.items()]],
        env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            record = json.loads(line)
            assert record["level"] in ("WARNING", "ERROR", "CRITICAL")
            if record["logger"] == "awa.jobs":
                break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert record["job_id"] == job_id and record["kind"] == "nobody_has_this"
    assert record["queue"] == "procs" and record["attempt"] == 1
    assert "UnknownJobKind" in record["message"]
