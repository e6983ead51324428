"""Admin changes of ring jobs (migration 0020; docs/storage.md, slice 3).

Every operation that changes a job by id, key, filter or queue moves the ring
jobs it targets into awa.jobs first (awa.ring_to_mutable), then acts there as
on any job: cancel (available, and running: the handler is told by NOTIFY
awa_cancel and its late completion writes nothing), retry, drain, wait_for's
registration, after= on ring parents, batch operations and the testing
harness. Each test checks the ring really held the job before the change.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from tests.helpers import wait_until

import awa
from awa.core.model import Outcome
from awa.db.queries import queries
from awa.worker.completion import Completer

S = awa.JobState


@dataclass
class Work:
    n: int


@pytest.fixture
async def ring(conn: asyncpg.Connection) -> asyncpg.Connection:
    """The test database's plain jobs go to the append-only lane."""
    await conn.execute(queries()["ring_enqueue_set"], True)
    return conn


async def _in_ring(conn: asyncpg.Connection, job_id: int) -> bool:
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM awa.ready WHERE id = $1)"
                                    " AND NOT EXISTS (SELECT 1 FROM awa.jobs WHERE id = $1)",
                                    job_id))


async def _claim(client: awa.AsyncClient, queue: str = "default") -> Any:
    """One attempt claimed through the worker's claim (both lanes)."""
    pool = await client.pool()
    [row] = await pool.fetch(queries()["attempt_claim"], queue, 1, 0.0, 60.0)
    return row


def _completer(pool: asyncpg.Pool) -> Completer:
    return Completer(pool, queries(), completed_retention=timedelta(days=1),
                     failed_retention=timedelta(days=1))


async def test_cancel_an_available_ring_job(client: awa.AsyncClient,
                                            ring: asyncpg.Connection) -> None:
    job = await client.insert(Work(1))
    assert await _in_ring(ring, job.id)
    cancelled = await client.cancel(job.id)
    assert cancelled is not None and cancelled.state is S.Cancelled
    assert (await client.get_job(job.id)).state is S.Cancelled
    pool = await client.pool()
    assert await pool.fetch(queries()["attempt_claim"], "default", 10, 0.0, 60.0) == []
    assert await client.cancel(job.id) is None  # already finished


async def test_cancel_a_running_ring_job_tells_its_worker(
        client: awa.AsyncClient, ring: asyncpg.Connection, database_url: str) -> None:
    job = await client.insert(Work(1))
    claimed = await _claim(client)
    assert claimed["id"] == job.id and claimed["receipt_slot"] is not None  # a ring attempt
    listener = await asyncpg.connect(database_url)
    heard: list[str] = []
    await listener.add_listener("awa_cancel", lambda *a: heard.append(a[3]))
    try:
        cancelled = await client.cancel(job.id)
        assert cancelled is not None and cancelled.state is S.Cancelled

        async def told() -> bool:
            await listener.execute("SELECT 1")
            return heard == [str(job.id)]
        await wait_until(told, message="the awa_cancel notice")
    finally:
        await listener.close()
    # The cancelled attempt's late completion writes nothing.
    pool = await client.pool()
    assert not await _completer(pool).write(job.id, claimed["run_lease"], Outcome("completed"),
                                            slot=claimed["receipt_slot"])
    assert (await client.get_job(job.id)).state is S.Cancelled


async def test_retry_a_cancelled_ring_job(client: awa.AsyncClient,
                                          ring: asyncpg.Connection) -> None:
    job = await client.insert(Work(1))
    await client.cancel(job.id)
    retried = await client.retry(job.id)
    assert retried.state is S.Available and retried.attempt == 0
    assert (await _claim(client))["id"] == job.id  # claimable again, once
    with pytest.raises(awa.ValidationError):
        await client.retry(job.id)  # running now


async def test_drain_a_queue_of_ring_jobs(client: awa.AsyncClient,
                                          ring: asyncpg.Connection) -> None:
    jobs = [await client.insert(Work(i), queue="d") for i in range(3)]
    keep = await client.insert(Work(9), queue="other")
    running = await client.insert(Work(5), queue="d2")
    await _claim(client, "d2")
    assert all([await _in_ring(ring, j.id) for j in jobs])
    assert await client.drain_queue("d") == 3
    assert [(await client.get_job(j.id)).state for j in jobs] == [S.Cancelled] * 3
    assert (await client.get_job(keep.id)).state is S.Available
    assert await _in_ring(ring, keep.id)  # another queue's jobs stay where they are
    pool = await client.pool()
    assert await pool.fetch(queries()["attempt_claim"], "d", 10, 0.0, 60.0) == []
    assert await client.drain_queue("d2") == 0  # a running job is not drained
    assert (await client.get_job(running.id)).state is S.Running


@pytest.mark.parametrize("running", [False, True])
async def test_wait_for_a_ring_job(client: awa.AsyncClient, ring: asyncpg.Connection,
                                   running: bool) -> None:
    job = await client.insert(Work(1))
    claimed = await _claim(client) if running else None
    waiting = asyncio.create_task(client.wait_for(job.id, timeout=30))
    pool = await client.pool()
    await wait_until(lambda: pool.fetchval("SELECT count(*) FROM awa.job_waiters"),
                     message="the waiter's registration")
    assert not await _in_ring(ring, job.id)  # moved to awa.jobs, marked there
    assert (await client.get_job(job.id)).metadata.get("_awa_waited") is True
    if claimed is None:
        await client.cancel(job.id)
        expected = S.Cancelled
    else:  # the worker's completion of the moved attempt wakes the waiter
        assert await _completer(pool).write(job.id, claimed["run_lease"],
                                            Outcome("completed"),
                                            slot=claimed["receipt_slot"])
        expected = S.Completed
    done = await asyncio.wait_for(waiting, 30)
    assert done.state is expected
    assert await pool.fetchval("SELECT count(*) FROM awa.job_waiters") == 0


@pytest.mark.parametrize("running", [False, True])
async def test_after_a_ring_parent(client: awa.AsyncClient, ring: asyncpg.Connection,
                                   running: bool) -> None:
    parent = await client.insert(Work(1))
    claimed = await _claim(client) if running else None
    child = await client.insert(Work(2), after=[parent])
    assert child.state is S.Scheduled
    assert not await _in_ring(ring, parent.id)
    assert (await client.get_job(parent.id)).metadata.get("_awa_dependents") is True
    pool = await client.pool()
    if claimed is None:
        claimed = await _claim(client)
        assert claimed["id"] == parent.id
    assert await _completer(pool).write(parent.id, claimed["run_lease"], Outcome("completed"),
                                        slot=claimed["receipt_slot"])
    assert (await client.get_job(child.id)).state is S.Available


async def test_a_running_parent_leaves_its_queue_claimable(
        client: awa.AsyncClient, ring: asyncpg.Connection, database_url: str) -> None:
    """A transaction inserting a child of a running ring parent holds no claim
    lock of the parent's queue: other jobs of that queue are claimed meanwhile."""
    parent = await client.insert(Work(1))
    await _claim(client)
    other = await client.insert(Work(2))
    producer = awa.AsyncClient(database_url)
    try:
        async with producer.transaction() as tx:
            await tx.insert(Work(3), after=[parent])
            row = await asyncio.wait_for(_claim(client), 10)
            assert row["id"] == other.id
    finally:
        await producer.close()


async def test_batch_operation_on_ring_jobs(client: awa.AsyncClient,
                                            ring: asyncpg.Connection) -> None:
    from awa.maintenance.batch import BatchRunner

    jobs = [await client.insert(Work(i), queue="b") for i in range(4)]
    await _claim(client, "b")  # the first one runs: not queued
    preview = await client.preview_set_priority(1, filter={"queue": "b"})
    assert preview["total_matched"] == 3
    op = await client.set_priority(1, filter={"queue": "b"})
    pool = await client.pool()
    runner = BatchRunner(pool, queries(), timedelta(seconds=1), lambda: True,
                         instance_id="test", chunk_size=2)
    await runner.run_once()
    done = await client.get_batch_operation(op["id"])
    assert (done["state"], done["processed"]) == ("completed", 3), done
    assert [(await client.get_job(j.id)).priority for j in jobs] == [2, 1, 1, 1]


async def test_the_testing_harness_runs_ring_jobs(client: awa.AsyncClient,
                                                  ring: asyncpg.Connection) -> None:
    from awa.testing import AwaTestClient

    seen: list[int] = []

    async def handle(job: awa.JobContext) -> None:
        seen.append(job.args.n)

    harness = AwaTestClient(client)
    first = await client.insert(Work(1), priority=3)
    urgent = await client.insert(Work(2), priority=1)
    assert await _in_ring(ring, first.id)
    result = await harness.work_one(Work, handle)
    assert result.job.id == urgent.id and result.is_completed()  # priority order kept
    client.task(Work)(handle)
    results = await harness.drain()
    assert [r.job.id for r in results] == [first.id] and seen == [2, 1]
    left = await client.insert(Work(3))
    assert await _in_ring(ring, left.id)
    await harness.clean()  # every job, the ring's too
    with pytest.raises(awa.JobNotFound):
        await client.get_job(left.id)
