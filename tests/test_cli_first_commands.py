"""What a newcomer's first CLI commands print (issue 44, item 9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.helpers import ROOT, SUBPROCESS_PATH, wait_for_state
from tests.test_cli import awa_cli

import awa


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_awa_version_needs_no_database() -> None:
    done = subprocess.run([sys.executable, "-m", "awa", "--version"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0 and done.stdout == f"awa {awa.__version__}\n"


async def test_queue_and_dlq_commands_say_what_they_did(
        database_url: str, client: awa.AsyncClient) -> None:
    assert ok(awa_cli(database_url, "dlq", "depth")) == "the dead letter queue is empty\n"
    assert ok(awa_cli(database_url, "dlq", "depth", "--json")).strip() == "{}"
    await client.insert({"n": 1}, kind="mail", queue="mail")
    assert ok(awa_cli(database_url, "queue", "pause", "mail", "--yes")) == "paused mail\n"
    assert ok(awa_cli(database_url, "queue", "resume", "mail", "--yes")) == "resumed mail\n"
    assert ok(awa_cli(database_url, "migrate", "--yes")) == "schema is up to date\n"
    assert "enqueued 2 jobs" in ok(awa_cli(database_url, "enqueue", "mail", "--queue", "mail",
                                           "--count", "2", "--yes"))
    stats = ok(awa_cli(database_url, "--format", "tsv", "queue", "stats")).splitlines()
    header = stats[0].split("\t")
    lag = stats[1].split("\t")[header.index("lag_seconds")]
    assert lag.replace(".", "", 1).isdigit() and len(lag.split(".")[1]) == 1, lag


async def test_cancel_and_retry_print_a_summary_not_every_traceback(
        database_url: str, client: awa.AsyncClient) -> None:
    @client.task(kind="boom", queue="q")
    async def boom(job: awa.Job) -> None:
        raise ValueError("kaboom " * 50)

    job = await client.insert({"secret_arg": "x"}, kind="boom", queue="q", max_attempts=1)
    await client.start([("q", 1)], poll_interval_ms=50)
    try:
        await wait_for_state(client, job.id, awa.JobState.Failed)
    finally:
        await client.shutdown()
    retried = ok(awa_cli(database_url, "job", "retry", str(job.id), "--yes"))
    assert "kaboom" not in retried and "secret_arg" not in retried
    lines = dict(line.split(None, 1) for line in retried.splitlines())
    assert lines["id"] == str(job.id) and lines["state"] == "available"
    assert lines["details"] == f"awa job dump {job.id}"
    cancelled = ok(awa_cli(database_url, "job", "cancel", str(job.id), "--yes"))
    assert "kaboom" not in cancelled
    assert dict(line.split(None, 1) for line in cancelled.splitlines())["state"] == "cancelled"
    full = ok(awa_cli(database_url, "job", "retry", str(job.id), "--yes", "--full"))
    assert "kaboom" in full and "secret_arg" in full


def test_awa_worker_names_a_missing_attribute(database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": SUBPROCESS_PATH}
    done = subprocess.run([sys.executable, "-m", "awa", "worker", "tests.apps.worker_app:clent"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert ("module 'tests.apps.worker_app' has no attribute 'clent' "
            "(did you mean tests.apps.worker_app:client?)") in done.stderr
    done = subprocess.run([sys.executable, "-m", "awa", "worker", "tests.apps.worker_app:Sleepy"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "is a type, not an awa.AsyncClient" in done.stderr


def test_awa_worker_logs_the_queues_it_serves(database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": SUBPROCESS_PATH}
    proc = subprocess.Popen(
        [sys.executable, "-m", "awa", "worker", "tests.apps.worker_app:client",
         "--queue", "procs=3"], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "worker started" in line:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert "serving queues: procs (3 workers)" in line
