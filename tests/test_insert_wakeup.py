"""Every insert path wakes idle workers (NOTIFY awa_jobs at commit), once per queue.

Migration 0014 replaced the statement-level wake-up trigger (transition table)
by a row-level one filtered by its WHEN clause; Awa's COPY path defers it and
notifies each queue itself. These tests pin what a worker observes: a NOTIFY
per queue with available jobs, nothing for scheduled jobs or rolled-back
inserts, and a job inserted by any path (or by another writer with plain SQL)
picked up by an idle worker long before its poll interval.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from tests.helpers import wait_until

import awa
from awa.telemetry.signals import Signals


@dataclasses.dataclass
class Ping:
    n: int


@pytest.fixture
async def heard(database_url: str) -> AsyncIterator[tuple[asyncpg.Connection, list[str]]]:
    """A connection listening on awa_jobs, and the payloads it received."""
    listener = await asyncpg.connect(database_url)
    got: list[str] = []
    await listener.add_listener("awa_jobs", lambda *a: got.append(a[3]))
    try:
        yield listener, got
    finally:
        await listener.close()


async def _settle(listener: asyncpg.Connection) -> None:
    # A round trip on the listening connection delivers what is pending.
    await listener.execute("SELECT pg_sleep(0.05)")


async def test_copy_notifies_once_per_queue_with_available_jobs(
        client: awa.AsyncClient, heard: tuple[asyncpg.Connection, list[str]]) -> None:
    listener, got = heard
    later = datetime.now(UTC) + timedelta(hours=1)
    n = await client.enqueue_many_copy(
        [Ping(i) for i in range(50)] + [Ping(99)], queue="qa",
        opts=[None] * 50 + [{"queue": "qsched", "run_at": later}])
    assert n == 51
    await client.enqueue_many_copy([Ping(i) for i in range(3)], queue="qb")
    await _settle(listener)
    assert sorted(got) == ["qa", "qb"]  # one each; the scheduled-only queue: none


async def test_copy_keeps_optional_columns(client: awa.AsyncClient) -> None:
    # Plain batches leave default columns out of the COPY; mixed ones send all.
    await client.enqueue_many_copy([Ping(1), Ping(2)], queue="plain")
    await client.enqueue_many_copy([Ping(3), Ping(4)], queue="rich",
                                   opts=[None, {"tags": ["t"], "metadata": {"m": 1},
                                                "ordering_key": "o"}])
    jobs = {j.args["n"]: j for j in await client.list_jobs()}
    assert jobs[1].tags == [] and jobs[1].metadata == {} and jobs[1].state == awa.JobState.Available
    assert jobs[3].tags == [] and jobs[3].metadata == {}
    assert jobs[4].tags == ["t"] and jobs[4].metadata == {"m": 1}
    assert jobs[4].ordering_key == "o"


async def test_single_and_staged_inserts_notify(
        client: awa.AsyncClient, heard: tuple[asyncpg.Connection, list[str]]) -> None:
    listener, got = heard
    await client.insert(Ping(1), queue="one")
    await client.insert_many_copy([Ping(i) for i in range(20)], queue="many")
    await client.insert(Ping(2), queue="later", run_at=datetime.now(UTC) + timedelta(hours=1))
    await wait_until(lambda: asyncio.sleep(0, len(got) >= 2), message="two notifies")
    await _settle(listener)
    assert sorted(got) == ["many", "one"]


async def test_rolled_back_insert_wakes_nobody(
        client: awa.AsyncClient, heard: tuple[asyncpg.Connection, list[str]]) -> None:
    listener, got = heard
    with pytest.raises(RuntimeError):
        async with client.transaction() as tx:
            await tx.insert(Ping(1), queue="gone")
            raise RuntimeError("roll back")
    await _settle(listener)
    assert got == []


async def test_other_writers_plain_insert_notifies(
        database_url: str, heard: tuple[asyncpg.Connection, list[str]]) -> None:
    listener, got = heard
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("INSERT INTO awa.jobs (kind, queue, args, state, priority, "
                           "max_attempts) VALUES ('ping', 'foreign', '{\"n\": 1}', "
                           "'available', 2, 25), ('ping', 'foreign', '{\"n\": 2}', "
                           "'available', 2, 25)")
    finally:
        await conn.close()
    await wait_until(lambda: asyncio.sleep(0, got), message="a notify")
    await _settle(listener)
    assert got == ["foreign"]  # folded: one per queue per transaction


@pytest.mark.parametrize("path", ["insert", "transaction", "insert_many_copy",
                                  "enqueue_many_copy", "plain_sql"])
async def test_idle_worker_wakes_promptly(database_url: str, path: str,
                                          signals: Signals) -> None:
    """A worker polling once a minute runs a new job well within that minute."""
    done = asyncio.Event()
    async with awa.AsyncClient(database_url) as worker:
        @worker.task(Ping, queue="wake")
        async def handle(job: awa.Job) -> None:
            done.set()

        await worker.start([("wake", 1)], poll_interval_ms=60_000)
        try:
            await signals.wait("claim", queue="wake", since=0)  # its first claim (empty)
            async with awa.AsyncClient(database_url) as producer:
                if path == "insert":
                    await producer.insert(Ping(1), queue="wake")
                elif path == "transaction":
                    async with producer.transaction() as tx:
                        await tx.insert(Ping(1), queue="wake")
                elif path == "insert_many_copy":
                    await producer.insert_many_copy([Ping(1)], queue="wake")
                elif path == "enqueue_many_copy":
                    await producer.enqueue_many_copy([Ping(1)], queue="wake")
                else:
                    conn = await asyncpg.connect(database_url)
                    try:
                        await conn.execute(
                            "INSERT INTO awa.jobs (kind, queue, args, state, priority, "
                            "max_attempts) VALUES ('ping', 'wake', '{\"n\": 1}', "
                            "'available', 2, 25)")
                    finally:
                        await conn.close()
            await asyncio.wait_for(done.wait(), timeout=15)  # far below the 60 s poll
        finally:
            await worker.shutdown(timeout_ms=2000)


async def test_copy_in_a_non_default_schema(database_url: str) -> None:
    """The deferred-notify setting keeps its name whatever the schema is called."""
    async with awa.AsyncClient(database_url, schema="other_awa") as c:
        await c.migrate()
        assert await c.enqueue_many_copy([Ping(1), Ping(2)], queue="q") == 2
        assert len(await c.list_jobs()) == 2
