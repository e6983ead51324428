"""Issue 31 item 8, the CLI's rough edges, through real subprocesses and a real database:
tables never cut when piped and ``--format tsv``; pausing or overriding a queue that
does not exist is refused unless ``--create``; cron commands have help; ``awa serve``
on a busy port is a one-line error and prints its URL only once serving; an unknown
batch operation id is "not found" (404), a malformed one names the rule (400)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import asyncpg
import pytest
from tests.ui_helpers import call, serving

import awa
from awa.web.ui import ui_app

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
#: A queue name longer than a whole 80-column screen.
LONG_QUEUE = "reports-" + "x" * 90


def cli_env(url: str, **extra: str) -> dict[str, str]:
    """The code under test (``$PYTHONPATH``, else this checkout's ``src``), no terminal
    size, no progress bars."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "AWA_PROGRESS", "AWA_HEALTH_ADDR")}
    path = [*filter(None, [env.get("PYTHONPATH")]), str(SRC), str(ROOT)]
    return {**env, "DATABASE_URL": url, "PYTHONPATH": os.pathsep.join(path), **extra}


def awa_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``awa ARGS`` with stdout piped (not a terminal) and no COLUMNS."""
    return subprocess.run([sys.executable, "-m", "awa", *args], env=cli_env(url), cwd=ROOT,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_worker_with_a_module_that_does_not_exist_is_a_short_error(database_url: str) -> None:
    result = awa_cli(database_url, "worker", "nosuchmod:client")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert errors == ["Error: Invalid value for target: cannot import 'nosuchmod': "
                      "No module named 'nosuchmod'"]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 3  # click's usage line, its hint and the one error line


# -- tables: never cut when piped; --format tsv / json ----------------------------------


async def test_piped_tables_show_every_header_and_value_whole(
        database_url: str, client: awa.AsyncClient) -> None:
    await client.insert({"n": 1}, kind="send_email", queue=LONG_QUEUE)
    stats = ok(awa_cli(database_url, "queue", "stats"))
    assert "…" not in stats
    for header in ("queue", "available", "scheduled", "retryable", "running",
                   "waiting_external", "failed", "completed_last_hour", "lag_seconds", "paused"):
        assert f" {header} " in stats
    [row] = [line for line in stats.splitlines() if LONG_QUEUE in line]
    assert row.split("│")[2].strip() == "1"  # its available count, on the same line
    jobs = ok(awa_cli(database_url, "job", "list"))
    assert "…" not in jobs and LONG_QUEUE in jobs and "max_attempts" in jobs


async def test_tsv_is_one_escaped_line_per_row(database_url: str,
                                                client: awa.AsyncClient) -> None:
    tricky = "tab\there|line\nbreak|back\\slash|\x1b[2J"
    await client.insert({"n": 1}, kind=tricky, queue="tsv")
    await client.insert({"n": 2}, kind="k" * 150 + "\\" * 50, queue="tsv")  # 250 shown
    lines = ok(awa_cli(database_url, "job", "list", "--format", "tsv")).splitlines()
    header = ["id", "kind", "queue", "state", "priority", "attempt", "max_attempts", "run_at",
              "tags"]
    assert lines[0].split("\t") == header and len(lines) == 3
    rows = [line.split("\t") for line in lines[1:]]
    assert all(len(row) == len(header) for row in rows)
    long_row, tricky_row = rows  # newest first
    assert tricky_row[1] == "tab\\there|line\\nbreak|back\\\\slash|\\x1b[2J"
    assert tricky_row[2:4] == ["tsv", "available"] and tricky_row[8] == "[]"
    assert long_row[1] == "k" * 150 + "\\" * 50 + "… (+25 bytes, use --full)"
    full = ok(awa_cli(database_url, "job", "list", "--format", "tsv", "--full"))
    assert "\t" + "k" * 150 + "\\" * 100 + "\t" in full

    # The global option, and a key/value answer.
    glob = ok(awa_cli(database_url, "--format", "tsv", "job", "list", "--queue", "tsv"))
    assert glob == "\n".join(lines) + "\n"
    assert ok(awa_cli(database_url, "--format", "tsv", "dlq", "depth", "--queue",
                      "tsv")) == "tsv\t0\n"
    # json is --json, exactly; a per-command choice beats the global one.
    exact = ok(awa_cli(database_url, "job", "list", "--json"))
    assert ok(awa_cli(database_url, "job", "list", "--format", "json")) == exact
    assert ok(awa_cli(database_url, "--format", "json", "job", "list")) == exact
    assert json.loads(exact)[1]["kind"] == tricky
    assert ok(awa_cli(database_url, "--format", "json", "job", "list", "--format",
                      "tsv")).splitlines()[0].split("\t") == header
    table = ok(awa_cli(database_url, "job", "list", "--format", "table"))
    assert "┃ id" in table and "\t" not in table
    clash = awa_cli(database_url, "job", "list", "--json", "--format", "tsv")
    assert clash.returncode == 2 and "Traceback" not in clash.stderr
    assert clash.stderr.strip().splitlines()[-1] == \
        "Error: --json and --format tsv contradict each other"


# -- a queue that does not exist ----------------------------------------------------------


async def test_pause_and_override_refuse_a_queue_that_does_not_exist(
        database_url: str, client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    error = one_line_error(awa_cli(database_url, "queue", "pause", "typo"))
    assert "queue 'typo' does not exist" in error and "--create" in error
    error = one_line_error(awa_cli(database_url, "queue", "overrides", "set", "typo",
                                   "--claim-batch-size", "5", "--yes"))
    assert "does not exist" in error and "--create" in error
    assert await conn.fetchval("SELECT count(*) FROM awa.queues") == 0
    assert await conn.fetchval("SELECT count(*) FROM awa.queue_overrides") == 0
    # Bad names are still a validation error, not "does not exist".
    assert "queue: must be 1-200 characters" in one_line_error(
        awa_cli(database_url, "queue", "pause", "x" * 201))

    assert ok(awa_cli(database_url, "queue", "pause", "typo", "--create")) == "paused typo\n"
    assert await conn.fetchval("SELECT paused FROM awa.queues WHERE queue = 'typo'")
    made = json.loads(ok(awa_cli(database_url, "queue", "overrides", "set", "fresh",
                                 "--claim-batch-size", "5", "--create", "--yes", "--json")))
    assert made[0]["queue"] == "fresh" and made[0]["claim_batch_size"] == 5

    # The library keeps pausing any queue (as awa-pg does).
    await client.pause_queue("library-made")
    assert await conn.fetchval("SELECT paused FROM awa.queues WHERE queue = 'library-made'")


async def test_a_queue_exists_when_anything_knows_it(
        database_url: str, client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    await client.insert({"n": 1}, kind="k", queue="has-jobs")
    await client.insert({"n": 1}, kind="k", queue="has-failed")
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
        assert ok(awa_cli(database_url, "queue", "pause", name)) == f"paused {name}\n"
    ok(awa_cli(database_url, "queue", "overrides", "set", "has-cron", "--deadline-ms", "0",
               "--yes"))


# -- cron help, awa serve -----------------------------------------------------------------


def test_cron_commands_have_help(database_url: str) -> None:
    listing = ok(awa_cli(database_url, "cron", "--help"))
    for verb in ("pause", "resume", "trigger", "remove"):
        [line] = [x for x in listing.splitlines() if x.strip().startswith(verb + " ")]
        assert "schedule NAME" in line, listing
        own = ok(awa_cli(database_url, "cron", verb, "--help"))
        assert "schedule NAME" in own


def test_serve_on_a_busy_port_is_one_line_and_prints_no_url(database_url: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = awa_cli(database_url, "serve", "--port", str(port))
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


# -- batch operation ids --------------------------------------------------------------------


async def test_unknown_batch_id_is_not_found_and_a_malformed_one_names_the_rule(
        database_url: str, client: awa.AsyncClient) -> None:
    unknown = str(uuid.uuid4())
    for args in (("batch", "show", unknown), ("batch", "cancel", unknown, "--yes")):
        assert one_line_error(awa_cli(database_url, *args)) == \
            f"error: batch operation not found: {unknown}"
    malformed = one_line_error(awa_cli(database_url, "batch", "show", "nope"))
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
