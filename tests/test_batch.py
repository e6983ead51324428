"""Durable batch operations: preview, submit, the leader's runner, races, cancel, CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from tests.helpers import FAST, ROOT, TO_MUTABLE, idle_task, wait_until

import awa
from awa.maintenance.batch import BatchRunner

#: A running leader picks batch operations up within a fraction of a second.
LEADER = {**FAST, "batch_interval_ms": 50}


@dataclass
class Work:
    n: int


async def start_leader(client: awa.AsyncClient, **options: Any) -> None:
    """A worker that serves a queue nobody uses: only its leader services matter."""
    idle_task(client, "idle")
    await client.start([("idle", 1)], **{**LEADER, **options})
    await wait_until(lambda: _leading(client), message="leadership")


async def _leading(client: awa.AsyncClient) -> bool:
    return client.runtime is not None and client.runtime.leader.is_leader


async def finished(client: awa.AsyncClient, op_id: str,
                   timeout: float = 30.0) -> awa.BatchOperation:
    """Wait until the operation is completed, cancelled or failed."""
    async def done() -> awa.BatchOperation | None:
        op = await client.get_batch_operation(op_id)
        return op if op["state"] in ("completed", "cancelled", "failed") else None
    op: awa.BatchOperation = await wait_until(done, timeout=timeout,
                                              message=f"batch operation {op_id} to finish")
    return op


def runner(client: awa.AsyncClient, pool: asyncpg.Pool, chunk_size: int = 500) -> BatchRunner:
    """The leader's runner, driven directly (always leading)."""
    return BatchRunner(pool, client._q, timedelta(seconds=1), lambda: True,
                       instance_id="test-runner", chunk_size=chunk_size)


async def runner_step(client: awa.AsyncClient, op_id: str) -> None:
    """One step of the leader's runner on ``op_id`` (a cancelling one is finalised)."""
    pool = await client.pool()
    async with pool.acquire() as conn:
        await runner(client, pool).step(conn, uuid.UUID(op_id))


async def test_preview_counts_queued_matches_and_samples(client: awa.AsyncClient,
                                                         conn: asyncpg.Connection) -> None:
    jobs = [await client.insert(Work(i), queue="a", tags=["vip"] if i % 3 == 0 else [])
            for i in range(15)]
    await client.insert(Work(99), queue="b")
    later = datetime.now(UTC) + timedelta(hours=1)
    scheduled = await client.insert(Work(100), queue="a", run_at=later)
    for j in jobs[:2]:
        await conn.execute(TO_MUTABLE, j.id)  # setup: the rows to change in awa.jobs
    await conn.execute("UPDATE awa.jobs SET state = 'running', attempt = 1 WHERE id = $1",
                       jobs[0].id)  # started: no longer queued
    await conn.execute("UPDATE awa.jobs SET state = 'retryable', run_at = $2 WHERE id = $1",
                       jobs[1].id, later)

    p = await client.preview_set_priority(1, filter={"queue": "a"})
    assert p["total_matched"] == 15  # 14 queued of the 15, plus the scheduled one
    assert [j["id"] for j in p["sample"]] == [j.id for j in jobs[1:11]]
    assert p["sample"][0]["queue"] == "a" and p["sample"][0]["state"] == "retryable"

    async def count(**f: Any) -> int:
        return (await client.preview_move_queue("z", filter=f))["total_matched"]  # type: ignore[arg-type]
    assert await count(tag="vip") == 4  # 3, 6, 9, 12 (0 is running)
    assert await count(state="scheduled") == 1
    assert await count(state="retryable", queue="a") == 1
    assert await count(ids=[jobs[0].id, jobs[2].id, scheduled.id, 10**12]) == 2
    assert await count(kind="work", queue="b") == 1
    assert await count(created_at_gte=jobs[5].created_at_datetime,
                       created_at_lt=jobs[7].created_at_datetime) == 2
    iso = jobs[13].created_at  # RFC 3339 text
    assert await count(created_at_gte=iso, queue="a") == 3  # 13, 14, scheduled
    assert await count() == 16
    assert await count(queue=None) == 16  # None means "any"
    assert (await client.preview_batch_operation("set_priority", spec={"priority": 4},
                                                 filter={"ids": []}))["total_matched"] == 0
    assert await conn.fetchval("SELECT count(*) FROM awa.batch_operations") == 0


async def test_validation_happens_before_anything_is_written(client: awa.AsyncClient,
                                                             conn: asyncpg.Connection) -> None:
    job = await client.insert(Work(1), queue="a")
    for empty in (None, {}, {"queue": None, "tag": None}):
        with pytest.raises(awa.ValidationError,
                           match="batch operation requires a filter or allow_all=True"):
            await client.set_priority(3, filter=empty)  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match="requires a filter"):
        await client.move_queue("b")
    bad: list[tuple[Any, Any, Any, str]] = [
        ("set_priority", {"priority": 0}, {"queue": "a"}, "priority"),
        ("set_priority", {"priority": 5}, {"queue": "a"}, "priority"),
        ("set_priority", {"priority": 2.0}, {"queue": "a"}, "priority"),
        ("set_priority", {}, {"queue": "a"}, "priority"),
        ("set_priority", {"priority": 2, "queue": "b"}, {"queue": "a"}, "unknown key"),
        ("move_queue", {"queue": ""}, {"queue": "a"}, "queue"),
        ("move_queue", {"queue": "x" * 201}, {"queue": "a"}, "queue"),
        ("move_queue", {"queue": 7}, {"queue": "a"}, "queue"),
        ("move_queue", {"queue": "b", "priority": 9}, {"queue": "a"}, "priority"),
        ("delete", {}, {"queue": "a"}, "unknown batch operation kind"),
        ("set_priority", {"priority": 1}, {"queues": "a"}, "unknown key"),
        ("set_priority", {"priority": 1}, {"queue": 3}, "filter.queue"),
        ("set_priority", {"priority": 1}, {"state": "running"}, "queued jobs"),
        ("set_priority", {"priority": 1}, {"state": "completed"}, "queued jobs"),
        ("set_priority", {"priority": 1}, {"ids": "1,2"}, "filter.ids"),
        ("set_priority", {"priority": 1}, {"ids": [1, True]}, "filter.ids"),
        ("set_priority", {"priority": 1}, {"created_at_gte": "yesterday"}, "ISO-8601"),
        ("set_priority", {"priority": 1}, {"created_at_lt": 5}, "created_at_lt"),
        ("set_priority", {"priority": 1}, "queue=a", "filter"),
    ]
    for op_kind, spec, f, message in bad:
        for call in (client.preview_batch_operation, client.submit_batch_operation):
            with pytest.raises(awa.ValidationError, match=message):
                await call(op_kind, spec=spec, filter=f)
    with pytest.raises(awa.ValidationError, match="submitted_by"):
        await client.set_priority(1, filter={"queue": "a"}, submitted_by="")
    assert await conn.fetchval("SELECT count(*) FROM awa.batch_operations") == 0
    assert (await client.get_job(job.id)).priority == 2

    with pytest.raises(awa.ValidationError, match="invalid batch operation id"):
        await client.get_batch_operation("nope")
    with pytest.raises(awa.BatchOperationNotFound, match="batch operation not found"):
        await client.get_batch_operation("00000000-0000-0000-0000-000000000000")
    with pytest.raises(awa.ValidationError, match="unknown batch operation state"):
        await client.list_batch_operations(state="done")  # type: ignore[arg-type]

    op = await client.set_priority(4, allow_all=True, submitted_by="ops@example.com")
    assert op["state"] == "pending" and op["submitted_by"] == "ops@example.com"
    assert op["filter"] == dict.fromkeys(("kind", "queue", "ids", "tag", "state",
                                          "created_at_gte", "created_at_lt"))
    assert op["spec"] == {"op_kind": "set_priority", "priority": 4}
    assert op["total_matched"] is None and op["cursor"] is None and op["processed"] == 0


async def test_set_priority_through_the_leader(client: awa.AsyncClient) -> None:
    jobs = [await client.insert(Work(i), queue="slow") for i in range(30)]
    other = await client.insert(Work(0), queue="fast")
    await start_leader(client)
    op = await client.set_priority(1, filter={"queue": "slow"}, submitted_by="test")
    done = await finished(client, op["id"])
    assert done["state"] == "completed", done
    assert (done["total_matched"], done["processed"], done["skipped"], done["errored"]) == \
        (30, 30, 0, 0)
    assert client.runtime is not None and done["runner_instance"] == client.runtime.instance_id
    assert done["cursor"] == {"after_job_id": jobs[-1].id, "max_job_id": other.id}
    assert done["started_at"] is not None and done["finalized_at"] is not None
    assert done["retention_until"] is not None
    kept = datetime.fromisoformat(done["retention_until"]) - datetime.fromisoformat(
        done["finalized_at"])
    assert kept == timedelta(days=90)
    for j in jobs:
        job = await client.get_job(j.id)
        assert job.priority == 1 and job.metadata == {"_awa_original_priority": 2}
    assert (await client.get_job(other.id)).priority == 2

    # A second change keeps the first original value.
    second = await client.set_priority(3, filter={"ids": [jobs[0].id]})
    again = await finished(client, second["id"])
    assert again["processed"] == 1
    job = await client.get_job(jobs[0].id)
    assert job.priority == 3 and job.metadata == {"_awa_original_priority": 2}


@dataclass
class Keyed:
    key: str


async def test_move_queue_wakes_workers_and_keeps_key_invariants(
        client: awa.AsyncClient) -> None:
    ran: list[int] = []

    @client.task(Work, queue="new")
    async def work(job: awa.JobContext) -> None:
        ran.append(job.id)

    plain = [await client.insert(Work(i), queue="old", metadata={"source": "test"})
             for i in range(5)]
    later = datetime.now(UTC) + timedelta(hours=1)
    scheduled = await client.insert(Work(50), queue="old", run_at=later)
    unique_any_queue = await client.insert(Work(60), queue="old", unique_opts={})
    unique_by_queue = await client.insert(Work(61), queue="old",
                                          unique_opts={"by_queue": True})
    ordered = await client.insert(Work(62), queue="old", ordering_key="customer-1")
    # Polling once a minute: only the NOTIFY of the move can wake the worker in time.
    await client.start([("new", 4)], **{**LEADER, "poll_interval_ms": 60_000})
    await wait_until(lambda: _leading(client), message="leadership")

    op = await client.move_queue("new", priority=1, filter={"queue": "old"})
    done = await finished(client, op["id"])
    assert done["state"] == "completed"
    assert (done["total_matched"], done["processed"], done["skipped"]) == (9, 7, 2)
    await wait_until(lambda: _completed(client, [*plain, unique_any_queue]),
                     message="moved jobs to run in the new queue")
    assert {j.id for j in [*plain, unique_any_queue]} <= set(ran)
    for j in [*plain, unique_any_queue]:
        job = await client.get_job(j.id)
        assert job.state is awa.JobState.Completed and job.queue == "new"
        assert job.metadata["_awa_original_queue"] == "old"
        assert job.metadata["_awa_original_priority"] == 2
    assert (await client.get_job(plain[0].id)).metadata["source"] == "test"
    moved = await client.get_job(scheduled.id)
    assert (moved.queue, moved.priority, moved.state) == ("new", 1, awa.JobState.Scheduled)
    # A key that includes the queue, and an ordered job, stay where they were.
    for j in (unique_by_queue, ordered):
        job = await client.get_job(j.id)
        assert job.queue == "old" and job.metadata == {}
    # The moved unique job's key still holds (it never depended on the queue).
    with pytest.raises(awa.UniqueConflict):
        await client.insert(Work(60), queue="old", unique_opts={})
    await client.insert(Work(61), queue="new", unique_opts={"by_queue": True})


async def _completed(client: awa.AsyncClient, jobs: list[awa.Job]) -> bool:
    states = [(await client.get_job(j.id)).state for j in jobs]
    return all(s is awa.JobState.Completed for s in states)


async def test_move_queue_racing_with_workers_claiming_the_same_jobs(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    runs: Counter[int] = Counter()
    ran_in: dict[int, str] = {}

    @client.task(Work, queue="src")
    async def work(job: awa.JobContext) -> None:
        runs[job.id] += 1
        ran_in[job.id] = job.queue
        await asyncio.sleep(0.005)

    n = 3000
    await client.enqueue_many_copy([Work(i) for i in range(n)], queue="src")
    ids = [r["id"] for r in await conn.fetch("SELECT id FROM awa.jobs_active ORDER BY id")]
    # Rescue is not what this races: a heartbeat round held up for 0.6 s by a
    # loaded machine (CI runs three suites on two cores) must not put a running
    # job back, so staleness is far above FAST's here.
    await client.start([("src", 8)], **{**LEADER, "heartbeat_staleness_ms": 10_000},
                       batch_chunk_size=40)
    await wait_until(lambda: _at_least(runs, 100), message="the worker to be draining")
    op = await client.move_queue("dst", filter={"queue": "src"})
    done = await finished(client, op["id"], timeout=60)
    await client.shutdown()

    assert done["state"] == "completed", done
    assert done["total_matched"] is not None and done["total_matched"] <= n - 100
    assert done["processed"] + done["skipped"] == done["total_matched"]
    assert done["errored"] == 0
    assert done["processed"] > 0  # the worker is far slower than the chunks
    rows = await conn.fetch("SELECT id, queue, state::text, metadata FROM awa.jobs_all")
    by_id = {r["id"]: r for r in rows}
    assert sorted(by_id) == ids  # no job lost, none duplicated
    moved = {i for i, r in by_id.items() if r["queue"] == "dst"}
    assert len(moved) == done["processed"]
    for i in moved:  # moved jobs never ran, and wait in their new queue
        assert by_id[i]["state"] == "available" and i not in runs
        assert by_id[i]["metadata"] == {"_awa_original_queue": "src"}
    for i in set(ids) - moved:  # the rest ran exactly once, in the old queue
        assert by_id[i]["queue"] == "src" and by_id[i]["metadata"] == {}
        assert by_id[i]["state"] == "completed", by_id[i]
    assert all(count == 1 for count in runs.values())
    assert set(ran_in.values()) == {"src"}
    completed = {i for i, r in by_id.items() if r["state"] == "completed"}
    assert completed == set(runs)


async def _at_least(runs: Counter[int], n: int) -> bool:
    return len(runs) >= n


async def test_a_job_claimed_while_its_chunk_waits_is_skipped(
        client: awa.AsyncClient, database_url: str) -> None:
    jobs = [await client.insert(Work(i), queue="q") for i in range(3)]
    claimer = await asyncpg.connect(database_url)
    try:
        await claimer.execute(TO_MUTABLE, jobs[1].id)  # setup: the row to lock in awa.jobs
        tx = claimer.transaction()
        await tx.start()
        # A claim in flight: the row is locked, the job is about to start.
        await claimer.execute("SELECT 1 FROM awa.jobs WHERE id = $1 FOR UPDATE", jobs[1].id)
        op = await client.set_priority(4, filter={"queue": "q"})
        run = runner(client, await client.pool())
        task = asyncio.create_task(run.run_once())
        await wait_until(lambda: _waiting_on_lock(claimer, 1), message="the chunk to wait")
        await claimer.execute("UPDATE awa.jobs SET state = 'running', attempt = 1, "
                              "run_lease = run_lease + 1 WHERE id = $1", jobs[1].id)
        await tx.commit()
        await task
    finally:
        await claimer.close()
    done = await client.get_batch_operation(op["id"])
    assert (done["state"], done["processed"], done["skipped"]) == ("completed", 2, 1)
    assert [(await client.get_job(j.id)).priority for j in jobs] == [4, 2, 4]
    assert (await client.get_job(jobs[1].id)).state is awa.JobState.Running


async def _waiting_on_lock(conn: asyncpg.Connection, n: int) -> bool:
    return int(await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'")) >= n


async def test_cancelled_midway(client: awa.AsyncClient, database_url: str) -> None:
    jobs = [await client.insert(Work(i), queue="c") for i in range(60)]
    blocker = await asyncpg.connect(database_url)
    try:
        await blocker.execute(TO_MUTABLE, jobs[5].id)  # setup: the row to lock in awa.jobs
        tx = blocker.transaction()
        await tx.start()
        # Holds the first job of the second chunk, so the runner stops there for a while.
        await blocker.execute("SELECT 1 FROM awa.jobs WHERE id = $1 FOR UPDATE", jobs[5].id)
        await start_leader(client, batch_chunk_size=5)
        op = await client.set_priority(1, filter={"queue": "c"})
        await wait_until(lambda: _processed(client, op["id"], 5), message="the first chunk")
        await wait_until(lambda: _waiting_on_lock(blocker, 1), message="the second chunk")
        # The cancel does not wait for the chunk in flight...
        assert (await client.cancel_batch_operation(op["id"]))["state"] == "cancelling"
        await tx.commit()  # ...which then finishes, and the runner stops after it.
    finally:
        await blocker.close()
    done = await finished(client, op["id"])
    assert done["state"] == "cancelled" and done["finalized_at"] is not None
    assert done["total_matched"] == 60 and done["processed"] == 10
    assert done["processed"] < done["total_matched"] and done["skipped"] == 0
    changed = [j.id for j in jobs if (await client.get_job(j.id)).priority == 1]
    assert changed == [j.id for j in jobs[:done["processed"]]]
    assert done["cursor"] is not None and done["cursor"]["after_job_id"] == changed[-1]
    with pytest.raises(awa.ValidationError, match="batch operation cannot be cancelled"):
        await client.cancel_batch_operation(op["id"])
    pool = await client.pool()
    assert await pool.fetchval("SELECT count(*) FROM awa.batch_operation_jobs") == 0


async def _processed(client: awa.AsyncClient, op_id: str, n: int) -> bool:
    return (await client.get_batch_operation(op_id))["processed"] >= n


async def test_list_get_cancel_pending_and_purge(client: awa.AsyncClient) -> None:
    await client.insert(Work(1), queue="a")
    first = await client.set_priority(3, filter={"queue": "a"})
    second = await client.move_queue("b", filter={"kind": "work"}, submitted_by="me")
    third = await client.set_priority(1, filter={"tag": "x"})
    listed = await client.list_batch_operations()
    assert [o["id"] for o in listed] == [third["id"], second["id"], first["id"]]
    assert [o["id"] for o in await client.list_batch_operations(limit=1)] == [third["id"]]
    assert await client.get_batch_operation(second["id"]) == second

    cancelling = await client.cancel_batch_operation(first["id"])  # the runner finalises it
    assert cancelling["state"] == "cancelling" and cancelling["finalized_at"] is None
    assert (await client.cancel_batch_operation(first["id"]))["state"] == "cancelling"
    await runner_step(client, first["id"])
    cancelled = await client.get_batch_operation(first["id"])
    assert cancelled["state"] == "cancelled" and cancelled["finalized_at"] is not None
    assert cancelled["retention_until"] is not None
    assert [o["id"] for o in await client.list_batch_operations(state="cancelled")] == \
        [first["id"]]
    assert len(await client.list_batch_operations(state="pending")) == 2
    with pytest.raises(awa.ValidationError, match=f"cannot be cancelled: {first['id']}"):
        await client.cancel_batch_operation(first["id"])

    assert await client.purge_batch_operations(datetime.now(UTC) - timedelta(hours=1)) == 0
    assert await client.purge_batch_operations(datetime.now(UTC) + timedelta(seconds=5)) == 1
    assert {o["id"] for o in await client.list_batch_operations()} == {second["id"], third["id"]}

    # Maintenance prunes finished operations past their retention.
    pool = await client.pool()
    run = runner(client, pool)
    await run.run_once()  # runs both (nothing matches the tag, one job moves)
    assert [o["state"] for o in await client.list_batch_operations()] == ["completed"] * 2
    await pool.execute("UPDATE awa.batch_operations SET retention_until = now() - interval '1s'"
                       " WHERE id = $1", third["id"])
    await run.run_once()
    assert [o["id"] for o in await client.list_batch_operations()] == [second["id"]]
    with pytest.raises(awa.ValidationError):
        await client.purge_batch_operations("soon")  # type: ignore[arg-type]


async def test_failing_jobs_are_counted_and_a_broken_operation_fails(
        client: awa.AsyncClient) -> None:
    jobs = [await client.insert(Work(i), queue="e") for i in range(6)]
    pool = await client.pool()
    await pool.execute("""
        CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.args->>'n' = '2' THEN RAISE EXCEPTION 'job % is frozen', NEW.id; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse BEFORE UPDATE ON awa.jobs
            FOR EACH ROW EXECUTE FUNCTION public.refuse();""")
    op = await client.set_priority(4, filter={"queue": "e"})
    await runner(client, pool, chunk_size=4).run_once()
    done = await client.get_batch_operation(op["id"])
    assert done["state"] == "completed"
    assert (done["processed"], done["skipped"], done["errored"]) == (5, 0, 1)
    assert done["last_error"] is not None and f"job {jobs[2].id} is frozen" in done["last_error"]
    assert [(await client.get_job(j.id)).priority for j in jobs] == [4, 4, 2, 4, 4, 4]

    await pool.execute("""
        CREATE FUNCTION public.no_snapshots() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'snapshots are disabled'; END $$;
        CREATE TRIGGER no_snapshots BEFORE INSERT ON awa.batch_operation_jobs
            FOR EACH ROW EXECUTE FUNCTION public.no_snapshots();""")
    op = await client.set_priority(1, filter={"queue": "e"})
    await runner(client, pool).run_once()
    failed = await client.get_batch_operation(op["id"])
    assert failed["state"] == "failed" and failed["finalized_at"] is not None
    assert failed["last_error"] is not None and "snapshots are disabled" in failed["last_error"]


async def test_snapshot_steps_over_id_gaps(client: awa.AsyncClient,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from awa.maintenance import batch as runner_module

    monkeypatch.setattr(runner_module, "SCAN_WINDOW", 4)
    jobs = [await client.insert(Work(i), queue="g", tags=["x"] if i % 2 else [])
            for i in range(12)]
    pool = await client.pool()
    for j in jobs[6:]:  # far apart: most windows would be empty if they started blindly
        await pool.execute(TO_MUTABLE, j.id)  # setup: the row to renumber in awa.jobs
        await pool.execute("UPDATE awa.jobs SET id = id + 1000000 * $2 WHERE id = $1",
                           j.id, j.id)
    op = await client.set_priority(3, filter={"tag": "x"})
    run = runner(client, pool, chunk_size=2)
    op_id = uuid.UUID(op["id"])
    async with pool.acquire() as conn:
        assert await run.step(conn, op_id)  # pending -> scanning
        steps = 0
        while (await client.get_batch_operation(op["id"]))["state"] == "scanning":
            assert await run.step(conn, op_id)
            steps += 1
        assert steps <= 12 // 4 + 6  # a window per run of 4 ids, one per lone far id
        scanned = await client.get_batch_operation(op["id"])
        assert scanned["state"] == "running" and scanned["total_matched"] == 6
        while await run.step(conn, op_id):
            pass
    done = await client.get_batch_operation(op["id"])
    assert (done["state"], done["processed"], done["skipped"]) == ("completed", 6, 0)
    assert await pool.fetchval("SELECT count(*) FROM awa.jobs WHERE priority = 3") == 6


def test_sync_client(sync_client: awa.Client, database_url: str) -> None:
    job = sync_client.insert(Work(1), queue="s")
    preview = sync_client.preview_move_queue("t", filter={"queue": "s"})
    assert preview["total_matched"] == 1 and preview["sample"][0]["id"] == job.id
    assert sync_client.preview_set_priority(1, filter={"queue": "s"})["total_matched"] == 1
    with pytest.raises(awa.ValidationError, match="requires a filter"):
        sync_client.set_priority(1)
    op = sync_client.move_queue("t", priority=3, filter={"queue": "s"})
    assert op["spec"] == {"op_kind": "move_queue", "queue": "t", "priority": 3}
    other = sync_client.set_priority(4, filter={"ids": [job.id]})
    assert sync_client.get_batch_operation(op["id"])["state"] == "pending"
    assert [o["id"] for o in sync_client.list_batch_operations()] == [other["id"], op["id"]]
    assert sync_client.cancel_batch_operation(op["id"])["state"] == "cancelling"

    async def finalise() -> None:
        async with awa.AsyncClient(database_url) as c:
            await runner_step(c, op["id"])
    asyncio.run(finalise())
    assert sync_client.get_batch_operation(op["id"])["state"] == "cancelled"
    assert sync_client.purge_batch_operations(datetime.now(UTC) + timedelta(minutes=1)) == 1
    sub = sync_client.submit_batch_operation("set_priority", spec={"priority": 2},
                                             filter={"queue": "s"})
    assert sub["op_kind"] == "set_priority"


def awa_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m awa --database-url URL ARGS`` with no terminal."""
    env = {k: v for k, v in os.environ.items() if k != "AWA_PROGRESS"}
    return subprocess.run([sys.executable, "-m", "awa", "--database-url", url, *args],
                          env={**env, "COLUMNS": "200"}, cwd=ROOT, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=60)


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def one_line_error(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode != 0
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert text in result.stderr, result.stderr


async def test_cli(database_url: str, client: awa.AsyncClient) -> None:
    jobs = [await client.insert(Work(i), queue="cli", tags=["t"]) for i in range(3)]
    url = database_url

    preview = ok_json(awa_cli(url, "batch", "preview", "set-priority", "1", "--queue", "cli",
                              "--json"))
    assert preview["total_matched"] == 3 and len(preview["sample"]) == 3
    table = awa_cli(url, "batch", "preview", "move-queue", "other", "--tag", "t")
    assert table.returncode == 0 and "3 queued jobs match" in table.stdout
    assert str(jobs[0].id) in table.stdout

    one_line_error(awa_cli(url, "batch", "set-priority", "1", "--yes"), "--all")
    one_line_error(awa_cli(url, "batch", "set-priority", "9", "--queue", "cli", "--yes"),
                   "priority")
    one_line_error(awa_cli(url, "batch", "set-priority", "1", "--queue", "cli"),
                   "not confirmed")
    one_line_error(awa_cli(url, "batch", "move-queue", "x", "--state", "running", "--yes"),
                   "queued jobs")
    one_line_error(awa_cli(url, "batch", "show", "not-a-uuid"), "invalid batch operation id")
    assert await (await client.pool()).fetchval("SELECT count(*) FROM awa.batch_operations") == 0

    op = ok_json(awa_cli(url, "batch", "set-priority", "1", "--queue", "cli", "--id",
                         str(jobs[0].id), "--id", str(jobs[1].id), "--by", "cli-test", "--yes",
                         "--json"))
    assert op["state"] == "pending" and op["submitted_by"] == "cli-test"
    assert op["filter"]["ids"] == [jobs[0].id, jobs[1].id]
    moved = awa_cli(url, "batch", "move-queue", "elsewhere", "--priority", "4", "--kind", "work",
                    "--created-after", "2000-01-01T00:00:00Z", "--yes")
    assert moved.returncode == 0 and "submitted" in moved.stdout
    everything = ok_json(awa_cli(url, "batch", "set-priority", "3", "--all", "--yes", "--json"))
    assert everything["filter"]["queue"] is None

    listed = ok_json(awa_cli(url, "batch", "list", "--json"))
    assert len(listed) == 3 and listed[-1]["id"] == op["id"]
    assert "priority → 3" in awa_cli(url, "batch", "list").stdout
    assert ok_json(awa_cli(url, "batch", "list", "--state", "pending", "--json"))[0]["state"] \
        == "pending"
    shown = ok_json(awa_cli(url, "batch", "show", op["id"], "--json"))
    assert shown["id"] == op["id"]
    assert "submitted_by" in awa_cli(url, "batch", "show", op["id"]).stdout

    cancelled = ok_json(awa_cli(url, "batch", "cancel", op["id"], "--yes", "--json"))
    assert cancelled["state"] == "cancelling"
    await runner_step(client, op["id"])
    one_line_error(awa_cli(url, "batch", "cancel", op["id"], "--yes"), "cannot be cancelled")
    future = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    purged = ok_json(awa_cli(url, "batch", "purge", "--before", future, "--yes", "--json"))
    assert purged == {"purged": 1}
    one_line_error(awa_cli(url, "batch", "purge", "--before", "someday", "--yes"), "ISO-8601")
