"""Inspection and basic admin: get, list, dump, cancel, retry, pause, drain, stats."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from tests.helpers import TO_MUTABLE, explain_prepared

import awa
from awa.admin.jobs import list_jobs
from awa.db.queries import queries


@dataclass
class Task:
    n: int


async def test_get_missing_job(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.JobNotFound):
        await client.get_job(123456)
    with pytest.raises(awa.AwaError):
        await client.dump_job(123456)


async def test_list_jobs_filters_and_order(client: awa.AsyncClient) -> None:
    a = await client.insert(Task(1), queue="q1")
    b = await client.insert(Task(2), queue="q2")
    c = await client.insert({"x": 1}, kind="other", queue="q1")
    await client.cancel(b.id)
    assert [j.id for j in await client.list_jobs()] == [c.id, b.id, a.id]
    assert [j.id for j in await client.list_jobs(queue="q1")] == [c.id, a.id]
    assert [j.id for j in await client.list_jobs(kind="task")] == [b.id, a.id]
    assert [j.id for j in await client.list_jobs(state=awa.JobState.Cancelled)] == [b.id]
    assert [j.id for j in await client.list_jobs(state="available", kind="task")] == [a.id]
    assert len(await client.list_jobs(limit=1)) == 1
    with pytest.raises(awa.ValidationError, match="state"):
        await client.list_jobs(state="bogus")
    with pytest.raises(awa.ValidationError, match="limit"):
        await client.list_jobs(limit=0)


async def test_dump_job_is_json(client: awa.AsyncClient) -> None:
    job = await client.insert(Task(1), tags=["t"], metadata={"awa:traceparent": "00-abc-def-01"})
    dumped = json.loads(await client.dump_job(job.id))
    assert dumped["id"] == job.id and dumped["state"] == "available"
    assert dumped["args"] == {"n": 1} and dumped["tags"] == ["t"]
    assert dumped["traceparent"] == "00-abc-def-01"
    assert job.traceparent == "00-abc-def-01"


async def test_cancel_and_retry(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    job = await client.insert(Task(1))
    cancelled = await client.cancel(job.id)
    assert cancelled is not None and cancelled.state is awa.JobState.Cancelled
    assert cancelled.finalized_at is not None
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs WHERE id = $1", job.id) == 0
    assert await conn.fetchval("SELECT state::text FROM awa.jobs_done WHERE id = $1",
                               job.id) == "cancelled"
    assert await client.cancel(job.id) is None  # already finished: nothing to do
    with pytest.raises(awa.JobNotFound):
        await client.cancel(999999)
    retried = await client.retry(job.id)
    assert retried.state is awa.JobState.Available and retried.attempt == 0
    assert retried.id == job.id and retried.finalized_at is None
    with pytest.raises(awa.ValidationError, match="available"):
        await client.retry(job.id)  # an available job cannot be retried
    with pytest.raises(awa.JobNotFound):
        await client.retry(999999)


async def test_retry_waiting_external(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    job = await client.insert(Task(1))
    await conn.execute(TO_MUTABLE, job.id)  # a ring job moves to awa.jobs (setup)
    await conn.execute("UPDATE awa.jobs SET state = 'waiting_external', attempt = 1, "
                       "callback_id = gen_random_uuid() WHERE id = $1", job.id)
    retried = await client.retry(job.id)
    assert retried.state is awa.JobState.Available and retried.attempt == 0
    assert retried.callback_id is None


async def test_cancel_running_job_notifies(client: awa.AsyncClient, database_url: str,
                                           conn: asyncpg.Connection) -> None:
    job = await client.insert(Task(1))
    await conn.execute(TO_MUTABLE, job.id)  # a ring job moves to awa.jobs (setup)
    await conn.execute("UPDATE awa.jobs SET state = 'running', attempt = 1, run_lease = 1 "
                       "WHERE id = $1", job.id)
    listener = await asyncpg.connect(database_url)
    got: list[str] = []
    await listener.add_listener("awa_cancel", lambda *a: got.append(a[3]))
    try:
        cancelled = await client.cancel(job.id)
        assert cancelled is not None and cancelled.state is awa.JobState.Cancelled
        for _ in range(100):
            if got:
                break
            await listener.execute("SELECT pg_sleep(0.01)")
        assert got == [str(job.id)]
    finally:
        await listener.close()
    # The stale attempt's completion now matches no row.
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs WHERE id = $1 AND run_lease = 1",
                               job.id) == 0


async def test_pause_resume_and_stats(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    await client.insert(Task(1), queue="q")
    await client.insert(Task(2), queue="q", run_at=datetime.now(UTC) + timedelta(hours=1))
    failed = await client.insert(Task(3), queue="q")
    await conn.execute(TO_MUTABLE, failed.id)  # a ring job moves to awa.jobs (setup)
    await conn.execute("""
        WITH moved AS (DELETE FROM awa.jobs j WHERE id = $1 RETURNING j)
        INSERT INTO awa.jobs_done SELECT f.* FROM moved m,
            LATERAL awa.finished(m.j, 'failed', interval '1 day') f""", failed.id)
    await client.pause_queue("q", paused_by="ops")
    await client.pause_queue("empty")
    stats = {s.queue: s for s in await client.queue_stats()}
    q = stats["q"]
    assert (q.available, q.scheduled, q.failed, q.total_queued, q.paused) == (1, 1, 1, 2, True)
    assert q.lag_seconds is not None and q.lag_seconds >= 0
    assert stats["empty"].paused and stats["empty"].total_queued == 0
    assert await conn.fetchval("SELECT paused_by FROM awa.queues WHERE queue = 'q'") == "ops"
    await client.resume_queue("q")
    assert not {s.queue: s for s in await client.queue_stats()}["q"].paused


async def test_drain_queue(client: awa.AsyncClient) -> None:
    for i in range(3):
        await client.insert(Task(i), queue="d")
    await client.insert(Task(9), queue="d", run_at=datetime.now(UTC) + timedelta(hours=1))
    keep = await client.insert(Task(10), queue="other")
    assert await client.drain_queue("d") == 4
    assert await client.drain_queue("d") == 0
    assert {j.state for j in await client.list_jobs(queue="d")} == {awa.JobState.Cancelled}
    assert (await client.get_job(keep.id)).state is awa.JobState.Available


async def _bloom_scans(conn: asyncpg.Connection) -> int:
    """Scans of the history's bloom index of names so far (this session's flushed)."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT 1")  # the end of a transaction flushes the counters
    n: int = await conn.fetchval(
        "SELECT coalesce(sum(s.idx_scan), 0) FROM pg_stat_user_indexes s "
        "JOIN pg_class i ON i.oid = s.indexrelid JOIN pg_am a ON a.oid = i.relam "
        "WHERE s.schemaname = 'awa' AND s.relname LIKE 'jobs_done%' AND a.amname = 'brin'")
    return n


async def test_finished_jobs_of_a_rare_or_absent_kind_or_queue_are_found_by_the_bloom_index(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """Migration 0027: a kind or queue that the history rarely or never holds is
    looked up through the bloom index of names (by the id index, a partition
    without one was read whole: 1.3 s at 10M jobs), one that it mostly holds by
    the id index; either way the newest first, and the same jobs."""
    rows = await conn.fetch("""
        INSERT INTO awa.jobs_done (id, kind, queue, args, state, priority, attempt,
                                   max_attempts, run_lease, run_at, created_at,
                                   finalized_at, prune_after)
        SELECT nextval(pg_get_serial_sequence('awa.jobs', 'id')),
               CASE WHEN g IN (10, 30000) THEN 'rare' ELSE 'task' END,
               CASE WHEN g = 20000 THEN 'quiet' ELSE 'q' END, '{}',
               CASE WHEN g = 30000 THEN 'failed' ELSE 'completed' END::awa.job_state,
               2, 1, 5, 1, now(), now(), now(), now() + interval '1 day'
        FROM generate_series(1, 60000) g RETURNING id, kind, queue""")
    # Summarizes the filled ranges, as autovacuum does (autosummarize) once they fill.
    await conn.execute("VACUUM ANALYZE awa.jobs_done")
    rare = sorted((r["id"] for r in rows if r["kind"] == "rare"), reverse=True)
    quiet = [r["id"] for r in rows if r["queue"] == "quiet"]
    live = await client.insert(Task(1), queue="quiet")  # the live part still counts

    assert [j.id for j in await client.list_jobs(kind="rare")] == rare
    assert [j.id for j in await client.list_jobs(state="completed", kind="rare")] == rare[1:]
    assert [j.id for j in await client.list_jobs(queue="quiet")] == [live.id, *quiet]
    assert await client.list_jobs(kind="never_ran") == []
    assert await client.list_jobs(state="completed", queue="nowhere") == []
    common = await client.list_jobs(kind="task", limit=20)
    assert [j.id for j in common] == [live.id, *sorted(
        (r["id"] for r in rows if r["kind"] == "task"), reverse=True)][:20]

    # The scans, counted on a connection of the test's own (statistics are per session).
    for kind, bloom in (("never_ran", True), ("rare", True), ("task", False)):
        for _ in range(7):  # past the calls after which a prepared statement may go generic
            before = await _bloom_scans(conn)
            await list_jobs(conn, queries(), kind=kind, limit=20)
            assert (await _bloom_scans(conn) > before) is bloom, kind


def _scans(plan: dict[str, object]) -> list[tuple[str, str]]:
    """(node type, index) of every scan of a jobs_done partition in an EXPLAIN JSON plan."""
    found = []
    if str(plan.get("Relation Name", "")).startswith("jobs_done"):
        found.append((str(plan["Node Type"]), str(plan.get("Index Name", ""))))
    for child in plan.get("Plans", []):  # type: ignore[union-attr]
        found += _scans(child)
    return found


@pytest.mark.parametrize("statement, arguments", [
    ("job_list_unsuccessful", "('failed', NULL, NULL, 50)"),
    ("job_list_unsuccessful", "('cancelled', NULL, 'q', 50)"),
    ("ui_recent_failures", "(10)"),
])
async def test_failed_and_cancelled_jobs_are_listed_through_their_own_index(
        client: awa.AsyncClient, conn: asyncpg.Connection, statement: str,
        arguments: str) -> None:
    """Migration 0025: failed and cancelled jobs, newest first, come from the partial
    index of the jobs that did not complete, whatever the plan: by the id index, a
    partition of history without one was read whole (1.5 s at 10M jobs)."""
    from awa.db.queries import queries
    await conn.execute("""
        INSERT INTO awa.jobs_done (id, kind, queue, args, state, priority, attempt,
                                   max_attempts, run_lease, run_at, created_at,
                                   finalized_at, prune_after)
        SELECT nextval(pg_get_serial_sequence('awa.jobs', 'id')), 'task', 'q', '{}',
               CASE WHEN g <= 3 THEN 'failed' WHEN g <= 5 THEN 'cancelled'
                    ELSE 'completed' END::awa.job_state,
               2, 1, 5, 1, now(), now(), now(), now() + interval '1 day'
        FROM generate_series(1, 3000) g""")
    await conn.execute("ANALYZE awa.jobs_done")
    failed = [j.id for j in await client.list_jobs(state="failed")]
    assert len(failed) == 3 and failed == sorted(failed, reverse=True)
    assert len(await client.list_jobs(state="cancelled", queue="q")) == 2
    assert len(await client.list_jobs(state="completed", limit=50)) == 50
    partial = {r["indexname"] for r in await conn.fetch(
        "SELECT indexname FROM pg_indexes WHERE schemaname = 'awa' "
        "AND tablename LIKE 'jobs_done%' AND indexdef LIKE '%(id) WHERE%'")}
    scans = _scans(await explain_prepared(conn, queries()[statement], arguments))
    assert scans and all(index in partial for _, index in scans), scans
