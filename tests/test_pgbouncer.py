"""Behind PgBouncer in transaction pooling mode: everything works, LISTEN falls back to polling.

Each test starts a private pgbouncer (tests/pgbouncer.py) in front of the
test server with a pool of four server connections, so consecutive
transactions of one client really do land on different server sessions.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import asyncpg
import pytest
from tests.helpers import FAST, wait_until
from tests.pgbouncer import PgBouncer

import awa
from awa.db import pool as db_pool
from awa.db.queries import queries

pytestmark = pytest.mark.pgbouncer

#: FAST, but a heartbeat delayed by a busy CI machine must not get a job
#: rescued and run twice: these tests assert exactly-once execution.
OPTIONS = {**FAST, "heartbeat_staleness_ms": 30_000}


@dataclass
class Work:
    n: int


@dataclass
class Flaky:
    n: int


@dataclass
class Waits:
    n: int


@dataclass
class Tick:
    pass


@pytest.fixture
def bouncer(server_url: str) -> Iterator[PgBouncer]:
    """A private transaction-pooling pgbouncer in front of the test server."""
    pgb = PgBouncer(server_url)
    try:
        yield pgb
    finally:
        pgb.stop()


async def _counts(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT state::text, count(*) AS n FROM awa.jobs_all GROUP BY 1")
    finally:
        await conn.close()
    return {r["state"]: r["n"] for r in rows}


async def test_pooler_is_detected_or_declared(bouncer: PgBouncer, database_url: str) -> None:
    url = bouncer.url(database_url)
    assert await db_pool.behind_pooler(url) is True  # detected
    assert await db_pool.behind_pooler(database_url) is False
    assert await db_pool.behind_pooler(url + "?pgbouncer=false") is False  # declared
    with pytest.raises(awa.ValidationError, match="pgbouncer"):
        await db_pool.behind_pooler(url + "?pgbouncer=maybe")
    # The option never reaches the server (PgBouncer would refuse an unknown
    # startup parameter), and the pool prepares no named statements.
    async with awa.AsyncClient(url + "?pgbouncer=true") as client:
        job = await client.insert(Work(1))
        assert (await client.get_job(job.id)).args == {"n": 1}
        pool = await client.pool()
        async with pool.acquire() as conn:
            assert conn.get_settings().server_version is not None
            assert await conn.fetch("SELECT name FROM pg_prepared_statements") == []


async def test_worker_drains_through_a_transaction_pooler(
        bouncer: PgBouncer, database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="awa")
    runs: Counter[int] = Counter()
    async with awa.AsyncClient(bouncer.url(database_url)) as client:
        await client.migrate()  # transaction-scoped advisory lock: fine behind a pooler

        @client.task(Work, queue="pgb")
        async def work(job: awa.JobContext) -> None:
            runs[job.id] += 1
            if job.args.n % 10 == 0:
                job.enqueue_on_completion(Tick(), queue="pgb")  # atomic follow-up

        @client.task(Flaky, queue="pgb")
        async def flaky(job: awa.JobContext) -> object:
            runs[job.id] += 1
            if job.attempt == 1:
                return awa.RetryAfter(0.05)
            if job.args.n == 0:
                raise awa.TerminalError("no")
            return None

        @client.task(Tick, queue="pgb")
        async def tick(job: awa.JobContext) -> None:
            runs[job.id] += 1

        for n in range(40):
            await client.insert(Work(n), queue="pgb")
        await client.insert_many_copy([Work(n) for n in range(40, 100)], queue="pgb")
        await client.enqueue_many_copy([Work(n) for n in range(100, 160)], queue="pgb")
        async with client.transaction() as tx:
            for n in range(160, 170):
                await tx.insert(Work(n), queue="pgb")
        await client.insert(Work(170), queue="pgb", unique_opts={})
        with pytest.raises(awa.UniqueConflict):
            await client.insert(Work(170), queue="pgb", unique_opts={})
        for n in range(3):
            await client.insert(Flaky(n), queue="pgb")

        TOTAL = 171 + 18 + 3  # Work 0..170, a Tick per tenth Work, Flaky
        await client.start([("pgb", 8)], **OPTIONS)
        try:
            async def drained() -> bool:
                counts = await _counts(database_url)
                return counts.get("completed", 0) + counts.get("failed", 0) == TOTAL
            await wait_until(drained, timeout=60, message="every job to finish")
            await wait_until(lambda: _true(_said_polling(caplog, "(detected)")),
                             message="the listener to say it polls")
            async def healthy() -> awa.HealthCheck | None:
                health = await client.health_check()
                return health if health.healthy else None
            health = await wait_until(healthy, message="a healthy worker")
            assert health.postgres_connected and health.listen_enabled is False
        finally:
            await client.shutdown()
    counts = await _counts(database_url)
    assert counts == {"completed": TOTAL - 1, "failed": 1}
    flaky_ids = [i for i, n in runs.items() if n != 1]
    assert len(flaky_ids) == 3 and all(runs[i] == 2 for i in flaky_ids)  # one retry each
    assert len(runs) == TOTAL  # every job ran, and (but Flaky's retry) exactly once


async def test_callbacks_cron_and_admin_through_a_transaction_pooler(
        bouncer: PgBouncer, database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="awa")
    tokens: dict[int, str] = {}
    results: dict[int, object] = {}
    async with awa.AsyncClient(bouncer.url(database_url) + "?pgbouncer=true") as client:

        @client.task(Waits, queue="cb")
        async def waits(job: awa.JobContext) -> None:
            token = await job.register_callback(timeout_seconds=60)
            tokens[job.id] = token.id
            results[job.id] = await job.wait_for_callback(token)

        @client.task(Tick, queue="cron")
        async def tick(job: awa.JobContext) -> None:
            pass

        client.periodic("every-second", "* * * * * *", Tick, Tick(), queue="cron")
        waiting = [await client.insert(Waits(n), queue="cb") for n in range(3)]
        await client.start([("cb", 4), ("cron", 2)], **OPTIONS)
        try:
            await wait_until(lambda: _true(len(tokens) == 3), message="callbacks registered")
            await client.resume_external(tokens[waiting[0].id], {"ok": 0})
            await client.heartbeat_callback(tokens[waiting[1].id], 120)
            await client.resume_external(tokens[waiting[1].id], {"ok": 1})
            await wait_until(lambda: _true(len(results) == 2), message="handlers resumed")
            assert results == {waiting[0].id: {"ok": 0}, waiting[1].id: {"ok": 1}}
            await client.fail_external(tokens[waiting[2].id], "provider said no")

            async def cron_fired() -> bool:
                return any(j.state is awa.JobState.Completed
                           for j in await client.list_jobs(kind="tick", queue="cron"))
            await wait_until(cron_fired, timeout=30, message="the cron job to fire and run")
            assert [c["name"] for c in await client.list_cron_jobs()] == ["every-second"]

            health = await client.health_check()
            assert health.listen_enabled is False and health.postgres_connected
        finally:
            await client.shutdown()

        # Admin operations (no worker running).
        failed = waiting[2].id
        assert (await client.get_job(failed)).state is awa.JobState.Failed
        assert (await client.move_failed_to_dlq(failed, "manual")) is not None
        assert await client.dlq_depth(queue="cb") == 1
        assert [e.job.id for e in await client.list_dlq(queue="cb")] == [failed]
        assert (await client.retry_from_dlq(failed)).state is awa.JobState.Available
        assert (await client.cancel(failed)).state is awa.JobState.Cancelled
        assert (await client.retry_failed(kind="waits")).matched == 0
        await client.pause_queue("idle", paused_by="test")
        job = await client.insert(Work(1), queue="idle")
        stats = {s.queue: s for s in await client.queue_stats()}
        assert stats["idle"].paused and stats["idle"].available == 1
        await client.resume_queue("idle")
        assert (await client.cancel(job.id)).state is awa.JobState.Cancelled
        assert (await client.retry(job.id)).state is awa.JobState.Available
        assert await client.drain_queue("idle") == 1
        assert str(job.id) in await client.dump_job(job.id)
        assert (await client.trigger_cron_job("every-second")).kind == "tick"
        assert await client.delete_cron_job("every-second")
    assert _said_polling(caplog, "pgbouncer=true")


async def test_migrations_through_a_transaction_pooler(bouncer: PgBouncer,
                                                       empty_database_url: str) -> None:
    url = bouncer.url(empty_database_url)
    results = await asyncio.gather(*(awa.migrate(url) for _ in range(4)))
    assert sorted(len(r) for r in results)[-1] == awa.current_migration_version()
    assert sum(len(r) for r in results) == awa.current_migration_version()  # applied once


#: The settings the worker's pools send at connection start, which PgBouncer
#: refuses unless told to ignore them (a declared pooler is sent none).
SESSION_SETTINGS = ("idle_in_transaction_session_timeout,jit,plan_cache_mode,"
                    "enable_seqscan,enable_bitmapscan")


async def test_session_mode_pooler_listens_when_declared(
        server_url: str, database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A detected pooler is never LISTENed through (its mode cannot be told safely,
    see awa.db.pool); ``pgbouncer=false`` declares a session pooler fit for LISTEN
    (one that accepts the worker's startup settings)."""
    pgb = PgBouncer(server_url, pool_mode="session", pool_size=8,
                    ignore_startup_parameters=SESSION_SETTINGS)
    try:
        for declared, listens in (("", False), ("?pgbouncer=false", True)):
            async with awa.AsyncClient(pgb.url(database_url) + declared) as client:
                @client.task(Work)
                async def work(job: awa.JobContext) -> None:
                    pass
                await client.start([("default", 2)], **OPTIONS)
                try:
                    async def listening() -> bool:
                        return (await client.health_check()).listen_enabled
                    if listens:
                        await wait_until(listening, message="LISTEN through a session pooler")
                    else:
                        await wait_until(lambda: _true(_said_polling(caplog, "(detected)")),
                                         message="the listener to say it polls")
                        assert not await listening()
                finally:
                    await client.shutdown()
    finally:
        pgb.stop()


async def test_no_session_state(client: awa.AsyncClient, database_url: str) -> None:
    """A claim leaves synchronous_commit on (it commits durably, see
    tests/test_lease_durability.py), and no named statement sets anything for
    the session or holds a session lock."""
    job = await client.insert(Work(1))
    q = queries()
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            rows = await conn.fetch(q["attempt_claim"], "default", 1, 0.0, 0.0)
            assert [r["id"] for r in rows] == [job.id]
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        assert await conn.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await conn.close()
    for name in q.names():
        sql = q[name]
        assert not re.search(r"(?:^|;)\s*SET\s+(?!LOCAL\b)", sql, re.I), name
        assert not re.search(r"set_config\([^)]*,\s*false\s*\)", sql, re.I), name
        assert not re.search(r"pg_advisory_(?:try_)?lock(?:_shared)?\(", sql, re.I), name
        assert not re.search(r"(?:^|;)\s*(?:UN)?LISTEN\b|\bPREPARE\s", sql, re.I), name


def _said_polling(caplog: pytest.LogCaptureFixture, reason: str) -> bool:
    return any(reason in r.getMessage() and "polling every" in r.getMessage()
               for r in caplog.records if r.name == "awa.runtime")


async def _true(value: bool) -> bool:
    return value
