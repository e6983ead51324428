"""The ``awa`` command line, through real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg

import awa

ROOT = Path(__file__).resolve().parent.parent


def awa_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": url, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "awa", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def test_migrate_and_health(empty_database_url: str) -> None:
    unhealthy = awa_cli(empty_database_url, "health")
    assert unhealthy.returncode == 1 and unhealthy.stderr.startswith("error: ")
    assert len(unhealthy.stderr.strip().splitlines()) == 1
    assert "applied migrations" in awa_cli(empty_database_url, "migrate").stdout
    assert "up to date" in awa_cli(empty_database_url, "migrate").stdout
    assert as_json(awa_cli(empty_database_url, "health", "--json"))["healthy"] is True
    sql = awa_cli(empty_database_url, "migrate", "--sql")
    assert sql.returncode == 0 and "CREATE TABLE awa.jobs" in sql.stdout


async def test_jobs_and_queues(database_url: str, client: awa.AsyncClient) -> None:
    out = awa_cli(database_url, "enqueue", "send_email", "--args", '{"to": "a@b"}',
                  "--queue", "mail", "--count", "7", "--json")
    assert as_json(out) == {"enqueued": 7} and "enqueueing" in out.stderr  # progress bar
    jobs = as_json(awa_cli(database_url, "job", "list", "--queue", "mail", "--json"))
    assert len(jobs) == 7 and jobs[0]["args"] == {"to": "a@b"}
    table = awa_cli(database_url, "job", "list")
    assert table.returncode == 0 and "send_email" in table.stdout
    job_id = str(jobs[0]["id"])
    assert json.loads(awa_cli(database_url, "job", "dump", job_id).stdout)["id"] == jobs[0]["id"]
    refused = awa_cli(database_url, "job", "cancel", job_id)  # no --yes, no terminal
    assert refused.returncode == 1 and "--yes" in refused.stderr
    assert (await client.get_job(int(job_id))).state is awa.JobState.Available
    assert as_json(awa_cli(database_url, "job", "cancel", job_id, "--yes",
                           "--json"))["state"] == "cancelled"
    assert as_json(awa_cli(database_url, "job", "retry", job_id, "--yes",
                           "--json"))["state"] == "available"
    missing = awa_cli(database_url, "job", "dump", "999999")
    assert missing.returncode == 1 and "not found" in missing.stderr
    bad = awa_cli(database_url, "enqueue", "k", "--args", "[1]")
    assert bad.returncode == 1 and "JSON object" in bad.stderr
    assert awa_cli(database_url, "queue", "pause", "mail", "--by", "ops").returncode == 0
    stats = {s["queue"]: s for s in as_json(awa_cli(database_url, "queue", "stats", "--json"))}
    assert stats["mail"]["paused"] is True and stats["mail"]["available"] == 7
    assert awa_cli(database_url, "queue", "resume", "mail").returncode == 0
    assert "cancelled 7 jobs" in awa_cli(database_url, "queue", "drain", "mail", "--yes").stdout


async def test_failed_jobs_dlq_and_cron(database_url: str, client: awa.AsyncClient,
                                        conn: asyncpg.Connection) -> None:
    jobs = [await client.insert({"n": n}, kind="broken", tags=["t"]) for n in range(3)]
    for j in jobs:  # fail them terminally, as a worker would
        await conn.execute("UPDATE awa.jobs SET attempt = 1 WHERE id = $1", j.id)
        await conn.execute("""
            WITH moved AS (DELETE FROM awa.jobs j WHERE id = $1 RETURNING j)
            INSERT INTO awa.jobs_done SELECT f.* FROM moved m,
                LATERAL awa.finished(m.j, 'failed', interval '1 day',
                                     awa.error_entry('boom', 1, true)) f""", j.id)
    run = json.loads(awa_cli(database_url, "job", "dump-run", str(jobs[0].id)).stdout)
    assert run["error"] == "boom"
    assert "moved" in awa_cli(database_url, "dlq", "move", str(jobs[0].id), "--yes").stdout
    assert as_json(awa_cli(database_url, "dlq", "depth", "--json")) == {"default": 1}
    listed = as_json(awa_cli(database_url, "dlq", "list", "--json"))
    assert [e["id"] for e in listed] == [jobs[0].id] and listed[0]["reason"] == "manual"
    guarded = awa_cli(database_url, "dlq", "purge", "--yes")
    assert guarded.returncode == 1 and "allow_all" in guarded.stderr
    assert as_json(awa_cli(database_url, "dlq", "retry", str(jobs[0].id), "--yes",
                           "--json"))["state"] == "available"
    assert "retried  2" in awa_cli(database_url, "job", "retry-failed", "--kind", "broken",
                                  "--yes").stdout
    await conn.execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, args, priority, "
        "max_attempts, missed_fire_policy) VALUES ('nightly', '0 3 * * *', 'UTC', 'report', "
        "'default', '{}', 2, 25, 'coalesce')")
    crons = as_json(awa_cli(database_url, "cron", "list", "--json"))
    assert crons[0]["name"] == "nightly" and crons[0]["next_fire_at"]
    for verb in ("pause", "resume", "trigger"):
        assert awa_cli(database_url, "cron", verb, "nightly").returncode == 0
    assert any(j.kind == "report" for j in await client.list_jobs())
    assert awa_cli(database_url, "cron", "remove", "nightly").returncode == 0
    gone = awa_cli(database_url, "cron", "remove", "nightly")
    assert gone.returncode == 1 and "nightly" in gone.stderr
