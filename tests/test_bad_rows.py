"""A stored job no worker can run (an infinite run_at, args too deep to decode, a kind
no handler knows) fails or waits alone: the rest of its queue keeps running."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from tests.helpers import FAST, hold_partitions, wait_for_state, wait_until

import awa
from awa.core import states
from awa.db import migrations
from awa.db.queries import bind_schema


async def test_a_stored_infinite_row_does_not_stop_its_queue(client: awa.AsyncClient,
                                                             conn: asyncpg.Connection) -> None:
    # A row written before the CHECK existed (or by another writer without it).
    await conn.execute("ALTER DOMAIN awa.job_run_at DROP CONSTRAINT job_run_at_check")
    for run_at in ("-infinity", "infinity"):
        await conn.execute("INSERT INTO awa.jobs (kind, queue, args, state, priority, "
                           "max_attempts, run_at) "
                           "VALUES ('step', 'q', '{}', $1, 2, 5, $2::text::timestamptz)",
                           "available" if run_at == "-infinity" else "scheduled", run_at)
    stats = {s.queue: s for s in await client.queue_stats()}
    assert stats["q"].available == 1 and stats["q"].scheduled == 1
    ids = [(await client.insert({"n": i}, kind="step", queue="q")).id for i in range(5)]
    ran: list[int] = []

    @client.task(kind="step", queue="q")
    async def step(job: awa.Job) -> None:
        ran.append(job.id)

    await client.start([("q", 4)], **FAST)  # priority aging is on by default
    try:
        for job_id in ids:
            await wait_for_state(client, job_id, awa.JobState.Completed)
        assert (await client.health_check()).healthy
        assert await client.queue_stats()
        # The row no Job can be built from was failed, not left to block its batch.
        bad = await wait_until(lambda: conn.fetchval(
            "SELECT id FROM awa.jobs_done WHERE kind = 'step' AND state = 'failed'"))
        assert "cannot be decoded" in (await client.get_job(bad)).errors[0]["error"]
    finally:
        await client.shutdown()
    assert sorted(ran) == ids


async def test_a_row_claimed_before_the_partitions_is_failed_after_them(
        client: awa.AsyncClient, conn: asyncpg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker claims before the partitions its outcomes land in exist (see
    test_recovery); a row it cannot decode then is failed once they do: its
    failure is an outcome too, and none is written before them."""
    partitions = hold_partitions(monkeypatch)
    await conn.execute("ALTER DOMAIN awa.job_run_at DROP CONSTRAINT job_run_at_check")
    bad = await conn.fetchval("INSERT INTO awa.jobs (kind, queue, args, state, priority, "
                              "max_attempts, run_at) VALUES ('step', 'q', '{}', 'available', "
                              "2, 5, '-infinity') RETURNING id")

    @client.task(kind="step", queue="q")
    async def step(job: awa.Job) -> None:
        return None

    start = asyncio.create_task(client.start([("q", 4)], **FAST))
    try:
        claimed = "SELECT state = 'running' FROM awa.jobs WHERE id = $1"
        await wait_until(lambda: conn.fetchval(claimed, bad), message="the claim")
        await asyncio.sleep(0.3)
        assert await conn.fetchval("SELECT count(*) FROM awa.jobs_done") == 0
        partitions.set()
        await asyncio.wait_for(start, timeout=10)
        await wait_for_state(client, bad, awa.JobState.Failed)
        assert "cannot be decoded" in (await client.get_job(bad)).errors[0]["error"]
    finally:
        partitions.set()
        await asyncio.gather(start, return_exceptions=True)
        await client.shutdown()


async def test_migration_moves_stored_infinities_to_finite_times(
        empty_database_url: str) -> None:
    conn = await asyncpg.connect(empty_database_url)
    try:
        before = [m for m in migrations.migrations() if m[0] < 9]
        async with conn.transaction():
            await conn.execute("CREATE SCHEMA awa")
            await conn.execute("CREATE TABLE awa.schema_migrations (version integer PRIMARY "
                               "KEY, description text NOT NULL, applied_at timestamptz NOT "
                               "NULL DEFAULT now())")
            for version, description, sql in before:
                await conn.execute(bind_schema(sql, "awa"))
                await conn.execute("INSERT INTO awa.schema_migrations VALUES ($1, $2)",
                                   version, description)
        for run_at in ("-infinity", "infinity"):
            await conn.execute("INSERT INTO awa.jobs (kind, queue, args, state, priority, "
                               "max_attempts, run_at) VALUES ('k', 'q', '{}', 'scheduled', 2, "
                               "5, $1::text::timestamptz)", run_at)
        await awa.migrate(empty_database_url)
        rows = await conn.fetch("SELECT run_at, isfinite(run_at) AS ok FROM awa.jobs "
                                "ORDER BY run_at")
        assert [r["ok"] for r in rows] == [True, True]
        assert rows[1]["run_at"] == states.RUN_AT_MAX
    finally:
        await conn.close()


async def test_a_stored_row_too_deep_to_decode_fails_alone(client: awa.AsyncClient,
                                                           conn: asyncpg.Connection) -> None:
    # Only another writer can store this (Awa refuses it); Python cannot decode it.
    await conn.execute("INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts)"
                       " VALUES ('step', 'q', $1::text::jsonb, 'available', 1, 5)",
                       '{"a":' + "[" * 3000 + "]" * 3000 + "}")
    bad = await conn.fetchval("SELECT id FROM awa.jobs")
    good = [(await client.insert({"n": i}, kind="step", queue="q")).id for i in range(3)]
    assert (await client.get_job(bad)).args == {}  # readable, though not decodable

    @client.task(kind="step", queue="q")
    async def step(job: awa.Job) -> None:
        return None

    await client.start([("q", 2)], **FAST)
    try:
        for job_id in good:
            await wait_for_state(client, job_id, awa.JobState.Completed)
        failed = await wait_for_state(client, bad, awa.JobState.Failed)
    finally:
        await client.shutdown()
    assert "nested too deeply" in failed.errors[0]["error"] and failed.errors[0]["terminal"]


async def test_unknown_kind_is_retried_for_a_newer_worker(client: awa.AsyncClient,
                                                          database_url: str) -> None:
    job = await client.insert({"x": 1}, kind="added_in_v2", queue="q", max_attempts=5)

    @client.task(kind="known", queue="q")
    async def known(job: awa.Job) -> None:
        return None

    await client.start([("q", 2)], **FAST)
    try:
        retried = await wait_for_state(client, job.id, awa.JobState.Retryable)
    finally:
        await client.shutdown()
    assert retried.attempt == 1 and "UnknownJobKind" in retried.errors[0]["error"]
    assert "terminal" not in retried.errors[0]
    assert retried.run_at_datetime > datetime.now(UTC)  # backoff, not an immediate hot loop

    async with awa.AsyncClient(database_url) as newer:
        ran: list[dict[str, Any]] = []

        @newer.task(kind="added_in_v2", queue="q")
        async def handle(job: awa.Job) -> None:
            ran.append(job.args)

        await newer.start([("q", 2)], **FAST)
        try:
            done = await wait_for_state(newer, job.id, awa.JobState.Completed, timeout=30)
        finally:
            await newer.shutdown()
    assert done.attempt == 2 and ran == [{"x": 1}]
