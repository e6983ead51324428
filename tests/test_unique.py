"""Unique jobs: keys, state bitmask, conflicts, bulk skipping, concurrency."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg
import pytest

import awa


@dataclass
class Report:
    account: int


async def test_duplicate_insert_conflicts(client: awa.AsyncClient) -> None:
    first = await client.insert(Report(1), unique_opts={})
    with pytest.raises(awa.UniqueConflict) as info:
        await client.insert(Report(1), unique_opts={})
    assert info.value.conflicting_job_id == first.id
    other = await client.insert(Report(2), unique_opts={})  # different args: fine
    assert other.unique_key != first.unique_key
    plain = await client.insert(Report(1))  # no unique opts: never conflicts
    assert plain.unique_key is None


async def test_key_options(client: awa.AsyncClient) -> None:
    await client.insert(Report(1), queue="a", unique_opts={"by_queue": True})
    await client.insert(Report(1), queue="b", unique_opts={"by_queue": True})
    with pytest.raises(awa.UniqueConflict):
        await client.insert(Report(1), queue="a", unique_opts={"by_queue": True})
    await client.insert(Report(5), unique_opts={"by_args": False, "by_period": 1})
    with pytest.raises(awa.UniqueConflict):
        await client.insert(Report(6), unique_opts={"by_args": False, "by_period": 1})
    await client.insert(Report(6), unique_opts={"by_args": False, "by_period": 2})


async def test_claim_released_by_states_outside_mask(client: awa.AsyncClient) -> None:
    job = await client.insert(Report(1), unique_opts={})
    await client.cancel(job.id)  # cancelled is not in the default mask
    again = await client.insert(Report(1), unique_opts={})
    assert again.id != job.id
    with pytest.raises(awa.UniqueConflict):
        await client.retry(job.id)  # re-claiming the key collides with the new job
    assert (await client.get_job(job.id)).state is awa.JobState.Cancelled


async def test_mask_including_cancelled_blocks(client: awa.AsyncClient) -> None:
    mask = awa.JobState.Available.bit | awa.JobState.Cancelled.bit
    job = await client.insert(Report(1), unique_opts={"states": mask})
    await client.cancel(job.id)
    with pytest.raises(awa.UniqueConflict):
        await client.insert(Report(1), unique_opts={"states": mask})
    # A mask without "scheduled": a scheduled duplicate is allowed...
    from datetime import UTC, datetime, timedelta
    later = datetime.now(UTC) + timedelta(hours=1)
    await client.insert(Report(9), run_at=later, unique_opts={"states": mask})
    await client.insert(Report(9), run_at=later, unique_opts={"states": mask})


async def test_bulk_skips_duplicates(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    await client.insert(Report(2), unique_opts={})
    jobs = [Report(1), Report(2), Report(3), Report(1)]
    inserted = await client.insert_many_copy(jobs, unique_opts={})
    assert [j.args["account"] for j in inserted] == [1, 3]
    assert await client.enqueue_many_copy([Report(3), Report(4)], unique_opts={}) == 1
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 4
    assert await conn.fetchval("SELECT count(*) FROM awa.unique_claims") == 4


async def test_concurrent_producers_insert_one(database_url: str,
                                               conn: asyncpg.Connection) -> None:
    clients = [awa.AsyncClient(database_url, max_connections=2) for _ in range(8)]
    try:
        async def attempt(c: awa.AsyncClient) -> str:
            try:
                async with c.transaction() as tx:
                    await tx.insert(Report(42), unique_opts={})
                    await tx.execute("SELECT pg_sleep(0.05)")  # widen the race window
                return "ok"
            except awa.UniqueConflict:
                return "conflict"
        results = await asyncio.gather(*(attempt(c) for c in clients for _ in range(3)))
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    assert results.count("ok") == 1 and results.count("conflict") == 23
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 1


async def test_cancel_by_unique_key(client: awa.AsyncClient) -> None:
    job = await client.insert(Report(7), queue="q1", unique_opts={"by_queue": True})
    assert await client.cancel_by_unique_key("report", queue="q2", args=Report(7)) is None
    cancelled = await client.cancel_by_unique_key("report", queue="q1", args=Report(7))
    assert cancelled is not None and cancelled.id == job.id
    assert cancelled.state is awa.JobState.Cancelled
    assert await client.cancel_by_unique_key("report", queue="q1", args=Report(7)) is None
    by_period = await client.insert(Report(0), unique_opts={"by_args": False, "by_period": 3})
    hit = await client.cancel_by_unique_key("report", period_bucket=3)
    assert hit is not None and hit.id == by_period.id
