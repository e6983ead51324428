"""The ``awa`` command line, through real subprocesses."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from tests.helpers import spawn_worker, wait_until

import awa
from awa.admin import bulk
from awa.db import migrations
from awa.db.queries import queries

ROOT = Path(__file__).resolve().parent.parent


def awa_cli(url: str, *args: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``awa ARGS`` with no terminal (so no progress bars unless AWA_PROGRESS=1)."""
    base = {k: v for k, v in os.environ.items() if k not in ("AWA_PROGRESS", "AWA_HEALTH_ADDR")}
    env = {**base, "DATABASE_URL": url, "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "awa", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


async def fail_jobs(conn: asyncpg.Connection, kind: str) -> None:
    """Fail every available job of ``kind`` terminally, as a worker would."""
    # Ring jobs (unless AWA_TEST_RING=0) move to awa.jobs first; a no-op otherwise.
    await conn.execute("SELECT count(*) FROM awa.ring_to_mutable(ARRAY("
                       "SELECT id FROM awa.jobs_active WHERE kind = $1))", kind)
    await conn.execute("UPDATE awa.jobs SET attempt = 1 WHERE kind = $1", kind)
    await conn.execute("""
        WITH moved AS (DELETE FROM awa.jobs j WHERE kind = $1 RETURNING j)
        INSERT INTO awa.jobs_done SELECT f.* FROM moved m,
            LATERAL awa.finished(m.j, 'failed', interval '1 day',
                                 awa.error_entry('boom', 1, true)) f""", kind)


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def test_migrate_and_health(empty_database_url: str) -> None:
    unhealthy = awa_cli(empty_database_url, "health")
    assert unhealthy.returncode == 1 and unhealthy.stderr.startswith("error: ")
    assert len(unhealthy.stderr.strip().splitlines()) == 1
    n = migrations.current_migration_version()
    migrated = awa_cli(empty_database_url, "migrate", env={"AWA_PROGRESS": "1"})
    assert "applied migrations" in migrated.stdout  # bar forced: one step per file
    assert "migrating" in migrated.stderr and f"{n}/{n}" in migrated.stderr
    assert "up to date" in awa_cli(empty_database_url, "migrate").stdout
    assert as_json(awa_cli(empty_database_url, "health", "--json"))["healthy"] is True
    sql = awa_cli(empty_database_url, "migrate", "--sql")
    assert sql.returncode == 0 and "CREATE TABLE awa.jobs" in sql.stdout


async def test_jobs_and_queues(database_url: str, client: awa.AsyncClient) -> None:
    out = awa_cli(database_url, "enqueue", "send_email", "--args", '{"to": "a@b"}',
                  "--queue", "mail", "--count", "7", "--json")
    assert as_json(out) == {"enqueued": 7} and out.stderr == ""  # no bar with --json
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
    await fail_jobs(conn, "broken")
    run = json.loads(awa_cli(database_url, "job", "dump-run", str(jobs[0].id)).stdout)
    assert run["error"] == "boom"
    assert "moved" in awa_cli(database_url, "dlq", "move", str(jobs[0].id), "--yes").stdout
    assert as_json(awa_cli(database_url, "dlq", "depth", "--json")) == {"default": 1}
    listed = as_json(awa_cli(database_url, "dlq", "list", "--json"))
    assert [e["id"] for e in listed] == [jobs[0].id] and listed[0]["reason"] == "manual"
    guarded = awa_cli(database_url, "dlq", "purge", "--yes")
    assert guarded.returncode == 1 and "--all" in guarded.stderr
    assert as_json(awa_cli(database_url, "dlq", "retry", str(jobs[0].id), "--yes",
                           "--json"))["state"] == "available"
    assert "retried 2 jobs" in awa_cli(database_url, "job", "retry-failed", "--kind", "broken",
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


async def test_enqueue_count_in_chunks(database_url: str, conn: asyncpg.Connection) -> None:
    quiet = awa_cli(database_url, "enqueue", "bulk", "--count", "10001", "--chunk-size", "5000")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.strip() == "enqueued 10001 jobs" and quiet.stderr == ""  # no TTY: no bar
    shown = awa_cli(database_url, "enqueue", "bulk", "--args", '{"x": 1}', "--count", "7",
                    "--chunk-size", "3", env={"AWA_PROGRESS": "1"})
    assert shown.stdout.strip() == "enqueued 7 jobs"
    assert "enqueueing" in shown.stderr and "7/7" in shown.stderr and "\x1b[" in shown.stderr
    counts = dict(await conn.fetch("SELECT args->>'x', count(*) FROM awa.jobs_active "
                                   "WHERE kind = 'bulk' GROUP BY 1"))
    assert counts == {None: 10001, "1": 7}


async def test_bulk_retry_discard_and_purge_in_chunks(database_url: str, client: awa.AsyncClient,
                                                      conn: asyncpg.Connection) -> None:
    await client.enqueue_many_copy([{"n": n} for n in range(25)], kind="broken", tags=["t"])
    await client.enqueue_many_copy([{"n": n} for n in range(5)], kind="other")
    await fail_jobs(conn, "broken")
    await fail_jobs(conn, "other")
    refused = awa_cli(database_url, "job", "retry-failed", "--kind", "broken")
    assert refused.returncode == 1 and "--yes" in refused.stderr
    out = awa_cli(database_url, "job", "retry-failed", "--kind", "broken", "--chunk-size", "4",
                  "--yes", env={"AWA_PROGRESS": "1"})
    assert out.stdout.strip().endswith("retried 25 jobs") and "25/25" in out.stderr
    rows = await conn.fetch("SELECT state, attempt FROM awa.jobs WHERE kind = 'broken'")
    assert len(rows) == 25 and {(r["state"], r["attempt"]) for r in rows} == {("available", 0)}
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_done WHERE kind = 'broken'") == 0

    await fail_jobs(conn, "broken")
    assert await client.bulk_move_failed_to_dlq(kind="broken") == 25
    assert as_json(awa_cli(database_url, "dlq", "retry-bulk", "--kind", "broken",
                           "--chunk-size", "4", "--yes", "--json")) == {"retried": 25}
    assert await conn.fetchval("SELECT count(*) FROM awa.dlq") == 0
    ids = await conn.fetch("SELECT id FROM awa.jobs WHERE kind = 'broken' AND attempt = 0")
    assert len({r["id"] for r in ids}) == 25

    await fail_jobs(conn, "broken")
    await client.bulk_move_failed_to_dlq(allow_all=True)  # 25 broken + 5 other
    purged = awa_cli(database_url, "dlq", "purge", "--tag", "t", "--chunk-size", "4", "--yes")
    assert purged.stdout.strip() == "purged 25 jobs" and purged.stderr == ""
    assert await conn.fetchval("SELECT count(*) FROM awa.dlq WHERE kind = 'other'") == 5
    assert await conn.fetchval("SELECT count(*) FROM awa.dlq") == 5
    nothing = awa_cli(database_url, "dlq", "purge", "--kind", "broken")  # no match: no question
    assert nothing.returncode == 0 and nothing.stdout.strip() == "purged 0 jobs"

    await client.enqueue_many_copy([{"n": n} for n in range(9)], kind="doomed")
    await fail_jobs(conn, "doomed")
    assert as_json(awa_cli(database_url, "job", "discard", "--kind", "doomed", "--chunk-size",
                           "2", "--yes", "--json")) == {"discarded": 9}
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_done WHERE kind = 'doomed'") == 0


async def test_bulk_chunks_act_once_on_jobs_that_come_back(client: awa.AsyncClient,
                                                           conn: asyncpg.Connection) -> None:
    # A worker failing retried jobs again between chunks must not make the run loop or
    # retry a job twice: chunks advance past the highest id seen.
    await client.enqueue_many_copy([{"n": n} for n in range(10)], kind="flaky")
    await fail_jobs(conn, "flaky")
    q = queries("awa")
    action = bulk.retry_failed(kind="flaky")
    scope = await bulk.scope(conn, q, action)
    assert scope.total == 10

    class RefailingConn:
        async def fetchrow(self, sql: str, *args: Any) -> Any:
            row = await conn.fetchrow(sql, *args)
            await fail_jobs(conn, "flaky")
            return row
    chunks: list[int] = []
    done = await bulk.run(RefailingConn(), q, action, scope,  # type: ignore[arg-type]
                          chunk_size=3, on_chunk=chunks.append)
    assert done == 10 and chunks == [3, 3, 3, 1]
    with pytest.raises(awa.ValidationError):
        bulk.retry_dlq()  # no filter without allow_all


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


async def test_health_against_a_worker(database_url: str, conn: asyncpg.Connection) -> None:
    port = _free_port()
    addr = f"127.0.0.1:{port}"
    worker = spawn_worker(database_url, env={"AWA_HEALTH_ADDR": addr})
    try:
        await wait_until(lambda: asyncio.to_thread(lambda: _readyz(port) == 200),
                         message="the worker's /readyz to answer 200")
        ready = awa_cli(database_url, "health", env={"AWA_HEALTH_ADDR": addr})  # addr from env
        assert ready.returncode == 0, ready.stderr
        assert "ready" in ready.stdout and "schema_compatible" in ready.stdout
        assert as_json(awa_cli(database_url, "health", "--addr", addr, "--json"))["ready"]

        # A schema newer than the worker's code: the listener answers 503.
        await conn.execute("INSERT INTO awa.schema_migrations (version, description) "
                           "VALUES (999, 'from the future')")
        await wait_until(lambda: asyncio.to_thread(lambda: _readyz(port) == 503),
                         message="the worker's /readyz to answer 503")
        not_ready = awa_cli(database_url, "health", "--addr", addr, "--json")
        assert not_ready.returncode == 1
        payload = json.loads(not_ready.stdout)
        assert payload["ready"] is False and payload["schema_compatible"] is False
        assert not_ready.stderr.startswith("error: ") and "schema_compatible" in not_ready.stderr
        assert len(not_ready.stderr.strip().splitlines()) == 1
        table = awa_cli(database_url, "health", "--addr", addr)
        assert table.returncode == 1 and "FAIL" in table.stdout
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    nobody = awa_cli(database_url, "health", "--addr", f"127.0.0.1:{_free_port()}")
    assert nobody.returncode == 1 and "cannot reach" in nobody.stderr
    assert len(nobody.stderr.strip().splitlines()) == 1
    bad = awa_cli(database_url, "health", "--addr", "nonsense")
    assert bad.returncode == 1 and "host:port" in bad.stderr


async def test_health_database_unreachable(database_url: str) -> None:
    down = awa_cli("postgresql://postgres@127.0.0.1:1/postgres", "health", "--timeout", "5")
    assert down.returncode == 1 and down.stderr.startswith("error: database unreachable")
    assert len(down.stderr.strip().splitlines()) == 1 and down.stdout == ""


def test_worker_help_names_the_deadline() -> None:
    out = subprocess.run([sys.executable, "-m", "awa", "worker", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "5 minutes" in out and "deadline_duration_ms" in out
    assert "--log-level" in out and "--log-format" in out
