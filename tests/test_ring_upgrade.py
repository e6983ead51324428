"""Upgrading to the append-only lane (migration 0020) loses nothing.

0020 adds the ring beside awa.jobs and moves no row: every job a database
holds at 0019, in whatever state, stays where it is, and the new workers claim
the mutable lane as before (awa.claim reads both). Enqueueing into the ring
stays off on an upgraded database until it is switched on, so workers not yet
upgraded (which claim only awa.jobs) see every new job meanwhile.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
from tests.helpers import FAST, schema_at, wait_until

import awa

TABLES = ("awa.jobs", "awa.jobs_done", "awa.dlq", "awa.job_dependencies", "awa.unique_claims")
TERMINAL = {awa.JobState.Completed, awa.JobState.Failed, awa.JobState.Cancelled}


async def _job(conn: asyncpg.Connection, kind: str, state: str = "available",
               **columns: Any) -> int:
    """One awa.jobs row as 0019's code wrote it."""
    values = {"kind": kind, "queue": "default", "args": "{}", "state": state, "priority": 2,
              "max_attempts": 3, **columns}
    names = ", ".join(values)
    params = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    # sql-safe: the column names are this test's own literals
    job_id: int = await conn.fetchval(
        f"INSERT INTO awa.jobs ({names}) VALUES ({params}) RETURNING id",  # noqa: S608
        *values.values())
    return job_id


async def _snapshot(conn: asyncpg.Connection) -> dict[str, list[asyncpg.Record]]:
    # sql-safe: TABLES are this test's own literals
    return {t: await conn.fetch(f"SELECT * FROM {t} ORDER BY 1, 2")  # noqa: S608
            for t in TABLES}


async def test_every_live_job_survives_the_upgrade_and_runs(empty_database_url: str) -> None:
    conn = await asyncpg.connect(empty_database_url)
    try:
        await schema_at(conn, 19)
        long_ago = "now() - interval '1 hour'"
        ids = {
            "available": await _job(conn, "plain"),
            "scheduled": await _job(conn, "plain", "scheduled",
                                    run_at=await conn.fetchval("SELECT now() + interval '1 s'")),
            "retryable": await _job(conn, "plain", "retryable", attempt=1),
            "running": await _job(conn, "plain", "running", attempt=1, run_lease=1,
                                  attempted_at=await conn.fetchval(f"SELECT {long_ago}"),
                                  heartbeat_at=await conn.fetchval(f"SELECT {long_ago}")),
            "keyed": await _job(conn, "plain", concurrency_key="k", concurrency_limit=1),
            "ordered": await _job(conn, "plain", ordering_key="o"),
            "unique": await _job(conn, "plain", unique_key=b"u1",
                                 unique_states=await conn.fetchval(
                                     "SELECT awa.state_bit('available') "
                                     "| awa.state_bit('running')")),
        }
        callback = uuid.uuid4()
        ids["waiting"] = await _job(conn, "plain", "waiting_external", attempt=1, run_lease=1,
                                    callback_id=callback, callback_timeout_at=await conn.fetchval(
                                        "SELECT now() + interval '1 hour'"))
        parent = await _job(conn, "plain", metadata='{"_awa_dependents": true}')
        child = await _job(conn, "plain", "scheduled", run_at=await conn.fetchval(
            "SELECT '9999-12-31 00:00:00+00'::timestamptz"))
        await conn.execute("INSERT INTO awa.job_dependencies (parent_id, child_id, policy, "
                           "ordinal) VALUES ($1, $2, 'cancel', 0)", parent, child)
        ids["parent"], ids["child"] = parent, child
        dead = await _job(conn, "plain", "running", attempt=3, run_lease=3)
        await conn.execute(
            "WITH gone AS (DELETE FROM awa.jobs j WHERE j.id = $1 RETURNING j) "
            "INSERT INTO awa.dlq SELECT d.* FROM gone g, "
            "LATERAL awa.finished(g.j, 'failed', interval '1 day') f, "
            "LATERAL awa.dead_lettered(f, 'max_attempts_exhausted') d", dead)
        before = await _snapshot(conn)

        # 0020 and everything after it (0022: the throughput rollup, insert-only;
        # 0023: the claim returns the rows its walk read).
        assert await awa.migrate(empty_database_url) == list(
            range(20, awa.current_migration_version() + 1))
        assert await _snapshot(conn) == before  # nothing moved, nothing changed
        # An upgraded database keeps enqueueing into awa.jobs until switched over.
        assert await conn.fetchval("SELECT enqueue FROM awa.ring") is False
    finally:
        await conn.close()

    async with awa.AsyncClient(empty_database_url) as client:
        ran: list[int] = []

        @client.task(kind="plain")
        async def plain(job: awa.JobContext) -> None:
            ran.append(job.id)

        await client.start([{"name": "default", "max_workers": 4}], **FAST)
        await client.complete_external(str(callback), {"ok": True})
        retried = await client.retry_from_dlq(dead)
        assert retried is not None
        every = [*ids.values(), dead]

        async def finished() -> list[awa.Job] | None:
            jobs = [await client.get_job(i) for i in every]
            return jobs if all(j.state in TERMINAL for j in jobs) else None

        jobs = await wait_until(finished, timeout=30, message="every upgraded job to finish")
        await client.shutdown()
    assert all(j.state is awa.JobState.Completed for j in jobs), [
        (j.id, j.state) for j in jobs]
    assert set(ran) >= set(every) - {ids["waiting"]}  # the callback completed it instead
    await asyncio.sleep(0)
