"""Caller-owned completion: the handler's rows and the job's completion commit
together, guarded by the run lease."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from tests.helpers import FAST, TO_MUTABLE, wait_for_state

import awa


@dataclass
class Charge:
    order: int
    mode: str = "ok"


@dataclass
class Receipt:
    order: int


async def orders(conn: asyncpg.Connection) -> list[int]:
    return [r["id"] for r in await conn.fetch("SELECT id FROM orders ORDER BY id")]


@pytest.fixture
async def app_table(conn: asyncpg.Connection) -> asyncpg.Connection:
    await conn.execute("CREATE TABLE orders (id int PRIMARY KEY, paid_by_job bigint)")
    return conn


def register(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    @client.task(Charge, completion="caller")
    async def charge(job: awa.JobContext) -> Any:
        tx = job.transaction
        await tx.execute("INSERT INTO orders VALUES ($1, $2)", job.args.order, job.id)
        await tx.insert(Receipt(job.args.order))
        if job.args.mode == "raise":
            raise RuntimeError("card declined")
        if job.args.mode == "retry":
            return awa.RetryAfter(60)
        if job.args.mode == "commit":
            await tx.commit()
        if job.args.mode == "stale":
            # Meanwhile the attempt is rescued and claimed again elsewhere.
            await conn.execute(TO_MUTABLE, job.id)  # setup: a ring attempt to awa.jobs
            await conn.execute("UPDATE awa.jobs SET run_lease = run_lease + 1 WHERE id = $1",
                               job.id)
        return awa.Output({"charged": job.args.order})


async def test_rows_and_completion_commit_together(client: awa.AsyncClient,
                                                   app_table: asyncpg.Connection) -> None:
    register(client, app_table)
    job = await client.insert(Charge(1))
    await client.start([("default", 2)], **FAST)
    try:
        done = await wait_for_state(client, job.id, awa.JobState.Completed)
    finally:
        await client.shutdown()
    assert done.output == {"charged": 1} and done.attempt == 1
    assert await orders(app_table) == [1]
    assert await app_table.fetchval("SELECT paid_by_job FROM orders") == job.id
    receipts = await client.list_jobs(kind="receipt")
    assert [r.args for r in receipts] == [{"order": 1}]


@pytest.mark.parametrize("mode", ["raise", "retry", "commit"])
async def test_nothing_commits_unless_completed(client: awa.AsyncClient,
                                                app_table: asyncpg.Connection,
                                                mode: str) -> None:
    register(client, app_table)
    job = await client.insert(Charge(2, mode))
    await client.start([("default", 1)], **FAST)
    try:
        retried = await wait_for_state(client, job.id, awa.JobState.Retryable)
    finally:
        await client.shutdown()
    assert await orders(app_table) == []
    assert await client.list_jobs(kind="receipt") == []
    if mode == "raise":
        assert "card declined" in retried.errors[-1]["error"]
    if mode == "commit":
        assert "commits with the job's completion" in retried.errors[-1]["error"]


async def test_stale_lease_rolls_back_rows_and_completion(client: awa.AsyncClient,
                                                          app_table: asyncpg.Connection) -> None:
    register(client, app_table)
    job = await client.insert(Charge(3, "stale"))
    await client.start([("default", 1)], **FAST)
    try:
        async def handled() -> bool:
            j = await client.get_job(job.id)
            return j.run_lease == 2 and client._runtime is not None \
                and job.id not in client._runtime._attempts
        from tests.helpers import wait_until
        await wait_until(handled, message="the stale attempt to finish")
    finally:
        await client.shutdown()
    after = await client.get_job(job.id)
    assert after.state is awa.JobState.Running and after.run_lease == 2  # the new owner's
    assert await orders(app_table) == []
    assert await client.list_jobs(kind="receipt") == []


async def test_registration_rules(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.ValidationError) as err:
        @client.task(Charge, completion="caller")
        def sync_handler(job: awa.JobContext) -> None: ...
    assert err.value.field == "completion"
    with pytest.raises(awa.ValidationError):
        client.task(Charge, completion="whenever")(lambda job: None)

    client.on_completed_enqueue(Receipt, lambda args, job: Charge(args.order))
    with pytest.raises(awa.ValidationError) as err:
        @client.task(Receipt, completion="caller")
        async def receipt(job: awa.JobContext) -> None: ...
    assert "on_completed_enqueue" in err.value.rule

    @client.task(Charge, completion="caller")
    async def charge(job: awa.JobContext) -> None: ...
    with pytest.raises(awa.ValidationError) as err:
        client.on_completed_enqueue(Charge, lambda args, job: Receipt(args.order))
    assert err.value.field == "trigger_type"

    @client.task(kind="plain")
    async def plain(job: awa.JobContext) -> None:
        job.transaction  # noqa: B018 - only caller-owned handlers have one
    job = await client.insert({"x": 1}, kind="plain", max_attempts=1)
    await client.start([("default", 1)], **FAST)
    try:
        failed = await wait_for_state(client, job.id, awa.JobState.Failed)
    finally:
        await client.shutdown()
    assert "completion='caller'" in failed.errors[-1]["error"]
