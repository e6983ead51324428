"""`insert_many`: a small batch in one statement, the same jobs as the COPY path."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

import awa
from awa.enqueue import producer


@dataclasses.dataclass
class Ping:
    n: int


def _shape(job: awa.Job) -> tuple[Any, ...]:
    return (job.kind, job.queue, job.state, job.priority, job.max_attempts, job.args, job.tags,
            job.metadata, job.unique_key, job.ordering_key, job.concurrency_key,
            job.concurrency_limit)


async def test_one_statement_and_copy_insert_the_same_jobs(client: awa.AsyncClient,
                                                           conn: asyncpg.Connection) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    jobs: list[Any] = [Ping(i) for i in range(6)] + [{"raw": "é"}]
    opts: list[dict[str, Any] | None] = [
        None, {"tags": ["x", "y"]}, {"run_at": later, "priority": 1},
        {"unique_opts": {}}, {"ordering_key": "o", "metadata": {"m": 1}},
        {"concurrency_key": "c", "max_in_flight": 3}, {"kind": "raw_kind"}]
    small = await client.insert_many(jobs, opts=opts, queue="q", tags=["t"])
    await conn.execute("DELETE FROM awa.unique_claims")
    copied = await client.insert_many_copy(jobs, opts=opts, queue="q", tags=["t"])
    assert [_shape(j) for j in small] == [_shape(j) for j in copied]
    assert small[1].tags == ["x", "y"] and small[0].tags == ["t"]
    assert small[2].state == awa.JobState.Scheduled and small[0].state == awa.JobState.Available
    assert [j.id for j in small] == sorted(j.id for j in small)
    stored = await conn.fetch("SELECT id, args FROM awa.jobs_all WHERE id = ANY($1) ORDER BY id",
                              [j.id for j in small])
    assert [r["args"] for r in stored] == [j.args for j in small]


async def test_duplicates_are_skipped(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    first = await client.insert(Ping(1), unique_opts={})
    inserted = await client.insert_many([Ping(1), Ping(2), Ping(2), Ping(3)],
                                        unique_opts={})
    assert [j.args["n"] for j in inserted] == [2, 3]
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 3
    assert first.id not in {j.id for j in inserted}


async def test_bad_input_writes_nothing(client: awa.AsyncClient,
                                        conn: asyncpg.Connection) -> None:
    with pytest.raises(awa.ValidationError, match="tags"):
        await client.insert_many([Ping(1), Ping(2)], opts=[None, {"tags": ["a\x00"]}])
    with pytest.raises(awa.ValidationError, match="kind"):
        await client.insert_many([Ping(1), {"no": "kind"}])
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 0
    assert await client.insert_many([]) == []


async def test_large_batches_and_transactions(client: awa.AsyncClient,
                                              conn: asyncpg.Connection) -> None:
    n = producer.ONE_STATEMENT_MAX + 1  # over the limit: the COPY path
    inserted = await client.insert_many([Ping(i) for i in range(n)], queue="big")
    assert [j.args["n"] for j in inserted] == list(range(n))
    async with client.transaction() as tx:  # under it, inside the caller's transaction
        small = await tx.insert_many([Ping(i) for i in range(3)], queue="tx")
        await tx.rollback()
    assert len(small) == 3
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs WHERE queue = 'tx'") == 0


def test_sync_client(sync_client: awa.Client) -> None:
    jobs = sync_client.insert_many([Ping(1), Ping(2)], queue="s")
    assert [j.args for j in jobs] == [{"n": 1}, {"n": 2}]
    assert jobs[0].queue == "s"


async def test_after_waits_for_parents(client: awa.AsyncClient) -> None:
    parent = await client.insert(Ping(0))
    children = await client.insert_many([Ping(1), Ping(2)], after=[parent])
    assert [j.args["n"] for j in children] == [1, 2]
    assert all(j.state != awa.JobState.Available for j in children)  # parked on the parent
