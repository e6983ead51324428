"""What CLI commands print, through real subprocesses: a line saying what they did, a
summary rather than every traceback; one-line errors for a missing module, queue or
batch operation (pausing or overriding a queue that does not exist is refused unless
``--create``); help for the cron commands; ``awa serve`` prints its URL once serving."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid

import asyncpg
import pytest
from tests.helpers import ROOT, SUBPROCESS_PATH, wait_for_state
from tests.test_cli import awa_cli
from tests.test_cli_tables import cli_env, ok, one_line_error, piped_cli
from tests.ui_helpers import call, serving

import awa
from awa.web.ui import ui_app


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


def test_worker_with_a_module_that_does_not_exist_is_a_short_error(database_url: str) -> None:
    result = piped_cli(database_url, "worker", "nosuchmod:client")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert errors == ["Error: Invalid value for target: cannot import 'nosuchmod': "
                      "No module named 'nosuchmod'"]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 3  # click's usage line, its hint and the one error line


async def test_pause_and_override_refuse_a_queue_that_does_not_exist(
        database_url: str, client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    error = one_line_error(piped_cli(database_url, "queue", "pause", "typo"))
    assert "queue 'typo' does not exist" in error and "--create" in error
    error = one_line_error(piped_cli(database_url, "queue", "overrides", "set", "typo",
                                   "--claim-batch-size", "5", "--yes"))
    assert "does not exist" in error and "--create" in error
    assert await conn.fetchval("SELECT count(*) FROM awa.queues") == 0
    assert await conn.fetchval("SELECT count(*) FROM awa.queue_overrides") == 0
    # Bad names are still a validation error, not "does not exist".
    assert "queue: must be 1-200 characters" in one_line_error(
        piped_cli(database_url, "queue", "pause", "x" * 201))

    assert ok(piped_cli(database_url, "queue", "pause", "typo", "--create")) == "paused typo\n"
    assert await conn.fetchval("SELECT paused FROM awa.queues WHERE queue = 'typo'")
    made = json.loads(ok(piped_cli(database_url, "queue", "overrides", "set", "fresh",
                                 "--claim-batch-size", "5", "--create", "--yes", "--json")))
    assert made[0]["queue"] == "fresh" and made[0]["claim_batch_size"] == 5

    # The library keeps pausing any queue (as awa-pg does).
    await client.pause_queue("library-made")
    assert await conn.fetchval("SELECT paused FROM awa.queues WHERE queue = 'library-made'")


async def test_a_queue_exists_when_anything_knows_it(
        database_url: str, client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    await client.insert({"n": 1}, kind="k", queue="has-jobs")
    await client.insert({"n": 1}, kind="k", queue="has-failed")
    # Ring jobs (unless AWA_TEST_RING=0) move to awa.jobs first; a no-op otherwise.
    await conn.execute("SELECT count(*) FROM awa.ring_to_mutable(ARRAY("
                       "SELECT id FROM awa.jobs_active WHERE queue = 'has-failed'))")
    await conn.execute("""
        WITH moved AS (DELETE FROM awa.jobs j WHERE queue = 'has-failed' RETURNING j)
        INSERT INTO awa.jobs_done SELECT f.* FROM moved m,
            LATERAL awa.finished(m.j, 'failed', interval '1 day',
                                 awa.error_entry('boom', 1, true)) f""")
    await conn.execute("INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, "
                       "args, priority, max_attempts, missed_fire_policy) VALUES "
                       "('nightly', '0 3 * * *', 'UTC', 'k', 'has-cron', '{}', 2, 25, "
                       "'coalesce')")
    await conn.execute("INSERT INTO awa.runtime_instances (instance_id, hostname, pid, "
                       "version, started_at, last_seen_at, queues) VALUES ('w1', 'h', 1, "
                       "'0', now(), now(), '{\"has-worker\": {\"max_workers\": 1}}')")
    await conn.execute("INSERT INTO awa.descriptors (scope, name, instance_id, descriptor, "
                       "fingerprint) VALUES ('queue', 'has-descriptor', 'w1', '{}', 'f')")
    await client.set_queue_override("has-override", claim_batch_size=3)
    for name in ("has-jobs", "has-failed", "has-cron", "has-worker", "has-descriptor",
                 "has-override"):
        assert ok(piped_cli(database_url, "queue", "pause", name)) == f"paused {name}\n"
    ok(piped_cli(database_url, "queue", "overrides", "set", "has-cron", "--deadline-ms", "0",
               "--yes"))


def test_cron_commands_have_help(database_url: str) -> None:
    listing = ok(piped_cli(database_url, "cron", "--help"))
    for verb in ("pause", "resume", "trigger", "remove"):
        [line] = [x for x in listing.splitlines() if x.strip().startswith(verb + " ")]
        assert "schedule NAME" in line, listing
        own = ok(piped_cli(database_url, "cron", verb, "--help"))
        assert "schedule NAME" in own


def test_serve_on_a_busy_port_is_one_line_and_prints_no_url(database_url: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = piped_cli(database_url, "serve", "--port", str(port))
    line = one_line_error(result)
    assert line == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert "Awa UI on" not in result.stdout + result.stderr


def test_serve_prints_its_url_once_it_answers(database_url: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "awa", "serve", "--port", "0",
                             "--read-only"], env=cli_env(database_url), cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("Awa UI on http://127.0.0.1:") and line.endswith(
            "/ (read-only)\n"), line
        url = line.split()[3]
        assert not url.endswith(":0/")  # the port it really listens on
        with urllib.request.urlopen(f"{url}api/config", timeout=10) as response:  # no retry
            assert response.status == 200
            assert json.loads(response.read())["read_only"] is True
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_unknown_batch_id_is_not_found_and_a_malformed_one_names_the_rule(
        database_url: str, client: awa.AsyncClient) -> None:
    unknown = str(uuid.uuid4())
    for args in (("batch", "show", unknown), ("batch", "cancel", unknown, "--yes")):
        assert one_line_error(piped_cli(database_url, *args)) == \
            f"error: batch operation not found: {unknown}"
    malformed = one_line_error(piped_cli(database_url, "batch", "show", "nope"))
    assert malformed.startswith("error: operation_id: invalid batch operation id 'nope': "
                                "must be a UUID, like ")
    with pytest.raises(awa.BatchOperationNotFound):
        await client.get_batch_operation(unknown)
    with pytest.raises(LookupError):
        await client.cancel_batch_operation(unknown)

    async with serving(ui_app(client=client)) as base:
        status, body = await call(f"{base}/api/batches/{unknown}")
        assert status == 404 and body["error"] == f"batch operation not found: {unknown}"
        status, body = await call(f"{base}/api/batches/{unknown}/cancel", {})
        assert status == 404
        status, body = await call(f"{base}/api/batches/nope")
        assert status == 400 and body["field"] == "operation_id"
        assert "must be a UUID" in body["rule"]
