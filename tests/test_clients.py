"""Transactions on both clients, and the sync client's parity with the async one."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import asyncpg
import pytest

import awa


@dataclass
class Order:
    id: int


async def test_transaction_commits_with_app_rows(client: awa.AsyncClient,
                                                 conn: asyncpg.Connection) -> None:
    await conn.execute("CREATE TABLE orders (id int primary key)")
    async with client.transaction() as tx:
        assert await tx.execute("INSERT INTO orders VALUES ($1)", 1) == 1
        job = await tx.insert(Order(1))
        jobs = await tx.insert_many([Order(2), Order(3)], queue="bulk")
        assert await tx.fetch_one("SELECT count(*) AS n FROM orders") == {"n": 1}
        assert await tx.fetch_optional("SELECT * FROM orders WHERE id = 99") is None
        assert await tx.fetch_all("SELECT id FROM orders") == [{"id": 1}]
        assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all") == 0  # not yet visible
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all") == 3
    assert (await client.get_job(job.id)).args == {"id": 1} and len(jobs) == 2


async def test_transaction_rolls_back_on_error(client: awa.AsyncClient,
                                               conn: asyncpg.Connection) -> None:
    await conn.execute("CREATE TABLE orders (id int primary key)")
    with pytest.raises(RuntimeError):
        async with client.transaction() as tx:
            await tx.execute("INSERT INTO orders VALUES (1)")
            await tx.insert(Order(1))
            raise RuntimeError("boom")
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all") == 0
    assert await conn.fetchval("SELECT count(*) FROM orders") == 0


async def test_awaited_transaction_explicit_commit_and_rollback(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    tx = await client.transaction()
    await tx.insert(Order(1))
    await tx.rollback()
    async with await client.transaction() as tx2:
        await tx2.insert(Order(2))
        await tx2.commit()
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all") == 1
    with pytest.raises(awa.AwaError):
        async with client.transaction() as tx3:
            await tx3.fetch_one("SELECT 1 WHERE false")


def test_sync_client_round_trip(sync_client: awa.Client) -> None:
    job = sync_client.insert(Order(1), queue="s")
    assert sync_client.get_job(job.id).args == {"id": 1}
    assert len(sync_client.insert_many_copy([Order(2), Order(3)])) == 2
    assert sync_client.enqueue_many_copy([Order(4)]) == 1
    with sync_client.transaction() as tx:
        tx.insert(Order(5))
        assert tx.fetch_one("SELECT count(*) AS n FROM awa.jobs_all")["n"] == 5
    with pytest.raises(ZeroDivisionError), sync_client.transaction() as tx:
        tx.insert(Order(6))
        raise ZeroDivisionError
    assert len(sync_client.list_jobs()) == 5
    assert sync_client.cancel(job.id) is not None
    assert sync_client.retry(job.id).state is awa.JobState.Available
    sync_client.pause_queue("s")
    assert [s.paused for s in sync_client.queue_stats() if s.queue == "s"] == [True]
    sync_client.resume_queue("s")
    assert sync_client.drain_queue("s") == 1
    with pytest.raises(awa.UniqueConflict):
        sync_client.insert(Order(7), unique_opts={})
        sync_client.insert(Order(7), unique_opts={})


#: Worker-side methods exist only on the async client.
ASYNC_ONLY = {"task", "worker", "start", "shutdown", "periodic", "pool", "database_url",
              "on_event", "runtime", "schema", "prepare_queue_storage_schema",
              # worker declarations, like task and periodic (the sync client runs no worker)
              "queue_descriptor", "job_kind_descriptor"}


def _public(cls: type) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")}


def test_sync_and_async_surfaces_match() -> None:
    async_methods = {n for n in _public(awa.AsyncClient)
                     if n not in ASYNC_ONLY and not n.startswith("on_")}
    assert async_methods - _public(awa.Client) == set()
    for name in async_methods - {"transaction", "close", "paced", "queue_depths"}:
        a = inspect.signature(getattr(awa.AsyncClient, name))
        s = inspect.signature(getattr(awa.Client, name))
        assert str(a) == str(s), name


async def test_storage_compatibility_knobs(client: awa.AsyncClient) -> None:
    import json

    await client.insert(Order(1))
    status = json.loads(await client.storage_status())
    assert status["schema"] == "awa" and status["active_jobs"] == 1
    assert status["schema_version"] == awa.current_migration_version()
    with pytest.raises(awa.ValidationError, match="queue_slot_count"):
        await client.install_queue_storage(queue_slot_count=0)
    await client.install_queue_storage(queue_slot_count=4, lease_slot_count=2)
    assert len(await client.list_jobs()) == 1
    await client.install_queue_storage(reset=True)
    assert await client.list_jobs() == []
    # As awa-pg's turns its queue storage on: plain jobs go to the append-only lane.
    assert json.loads(await client.storage_status())["ring_enqueue"] is True
    plain = await client.insert(Order(2))
    pool = await client.pool()
    assert await pool.fetchval("SELECT count(*) FROM awa.ready WHERE id = $1", plain.id) == 1
    assert (await client.get_job(plain.id)).args == {"id": 2}
    await client.insert(Order(1), unique_opts={})  # claims were reset too
