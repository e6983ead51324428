"""Structured progress: buffered, lease-guarded, kept across retries, cleared on completion."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from tests.helpers import FAST, TO_MUTABLE, spawn_worker, wait_until

import awa
from awa.telemetry.signals import Signals

S = awa.JobState


@dataclass
class Batch:
    fail_first: bool = False


async def _job_where(client: awa.AsyncClient, job_id: int, check: Any) -> awa.Job | None:
    job = await client.get_job(job_id)
    return job if check(job) else None


async def test_progress_is_flushed_kept_on_retry_and_cleared_on_completion(
        client: awa.AsyncClient) -> None:
    seen: list[dict[str, Any] | None] = []
    release = asyncio.Event()

    @client.task(Batch)
    async def handle(job: awa.JobContext) -> None:
        seen.append(job.progress)
        if job.attempt == 1:
            job.set_progress(150, "over the top")  # clamped to 100
            job.set_progress(40, "reading")
            job.update_metadata({"cursor": 40})
            await job.flush_progress()
            await release.wait()
            job.update_metadata({"cursor": 41, "extra": True})
            raise RuntimeError("crash after checkpoint")
        job.set_progress(100, "done")

    job = await client.insert(Batch(fail_first=True))
    await client.start([("default", 1)], **FAST)
    flushed = await wait_until(lambda: _job_where(client, job.id, lambda j: j.progress))
    assert flushed.progress == {"percent": 40.0, "message": "reading",
                                "metadata": {"cursor": 40}}
    release.set()
    done = await wait_until(lambda: _job_where(client, job.id, lambda j: j.state is S.Completed),
                            timeout=20)
    # The second attempt resumed from the checkpoint written with the retry outcome.
    assert seen[0] is None
    assert seen[1] == {"percent": 40.0, "message": "reading",
                       "metadata": {"cursor": 41, "extra": True}}
    assert done.progress is None  # cleared on completion


async def test_progress_written_with_heartbeat(client: awa.AsyncClient) -> None:
    release = asyncio.Event()

    @client.task(Batch)
    async def handle(job: awa.JobContext) -> None:
        job.set_progress(10)
        await release.wait()

    job = await client.insert(Batch())
    await client.start([("default", 1)], **FAST)
    beat = await wait_until(lambda: _job_where(client, job.id, lambda j: j.progress))
    assert beat.progress == {"percent": 10.0, "message": None, "metadata": {}}
    release.set()


async def test_progress_kept_on_snooze_and_cancel(client: awa.AsyncClient) -> None:
    @client.task(Batch)
    async def handle(job: awa.JobContext) -> object:
        job.update_metadata({"at": job.attempt})
        return awa.Cancel("stop") if job.args.fail_first else awa.Snooze(3600)

    snoozed = await client.insert(Batch())
    cancelled = await client.insert(Batch(fail_first=True))
    await client.start([("default", 2)], **FAST)
    s = await wait_until(lambda: _job_where(client, snoozed.id, lambda j: j.state is S.Scheduled))
    c = await wait_until(lambda: _job_where(client, cancelled.id,
                                            lambda j: j.state is S.Cancelled))
    assert s.progress == {"percent": 0.0, "message": None, "metadata": {"at": 1}}
    assert c.progress == {"percent": 0.0, "message": None, "metadata": {"at": 1}}


async def test_progress_outside_an_attempt_raises(client: awa.AsyncClient) -> None:
    kept: list[awa.JobContext] = []

    @client.task(Batch)
    async def handle(job: awa.JobContext) -> None:
        kept.append(job)

    job = await client.insert(Batch())
    await client.start([("default", 1)], **FAST)
    await wait_until(lambda: _job_where(client, job.id, lambda j: j.state is S.Completed))
    ctx = kept[0]
    with pytest.raises(RuntimeError):
        ctx.set_progress(1)
    with pytest.raises(RuntimeError):
        ctx.update_metadata({"a": 1})
    with pytest.raises(RuntimeError):
        await ctx.flush_progress()
    with pytest.raises(RuntimeError):
        await ctx.register_callback()


async def test_checkpoint_survives_sigkill(client: awa.AsyncClient, database_url: str,
                                           conn: asyncpg.Connection) -> None:
    job = await client.insert({"seconds": 60}, kind="checkpointed", queue="procs")
    proc = spawn_worker(database_url, workers=2)
    try:
        await wait_until(lambda: _job_where(client, job.id, lambda j: j.progress), timeout=30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    resumed_from: list[Any] = []

    @client.task(dict, kind="checkpointed", queue="procs")
    async def handle(j: awa.JobContext) -> None:
        resumed_from.append(j.progress)

    await client.start([("procs", 1)], **FAST)
    await wait_until(lambda: _job_where(client, job.id, lambda j: j.state is S.Completed),
                     timeout=20)
    assert resumed_from == [{"percent": 50.0, "message": "halfway",
                             "metadata": {"cursor": 500, "attempt_seen": 1}}]


async def test_heartbeat_skips_a_locked_row_and_keeps_its_progress(
        client: awa.AsyncClient, conn: asyncpg.Connection, signals: Signals) -> None:
    """A heartbeat never waits for a row lock (so it cannot deadlock with a
    completion batch): the other attempts are still beaten, and the locked one
    keeps its attempt and its buffered progress, written by the first beat
    after the lock is gone."""
    release = asyncio.Event()
    contexts: dict[int, awa.JobContext] = {}

    @client.task(Batch)
    async def handle(job: awa.JobContext) -> None:
        contexts[job.id] = job
        await release.wait()

    locked, other = await client.insert(Batch()), await client.insert(Batch())
    # Staleness well above the lock's 0.5 s, so rescue cannot take the locked job
    # the moment the lock goes (its heartbeat is skipped meanwhile, by design).
    await client.start([("default", 2)], **{**FAST, "heartbeat_staleness_ms": 30_000})
    await wait_until(lambda: asyncio.sleep(0, len(contexts) == 2))
    for job_id in (locked.id, other.id):  # ring attempts move to awa.jobs
        await conn.execute(TO_MUTABLE, job_id)
    beat_sql = "SELECT heartbeat_at FROM awa.jobs WHERE id = $1"
    async with conn.transaction():
        before = await conn.fetchval(beat_sql + " FOR UPDATE", locked.id)
        other_before = await conn.fetchval(beat_sql, other.id)
        contexts[locked.id].set_progress(55, "while locked")
        await signals.pass_after("heartbeat", count=3)  # three whole beats while locked
        assert not contexts[locked.id].is_cancelled()  # not mistaken for a lost attempt
        assert await conn.fetchval(beat_sql, locked.id) == before
        assert await conn.fetchval(beat_sql, other.id) > other_before  # not held up
    beat = await wait_until(lambda: _job_where(client, locked.id, lambda j: j.progress))
    assert beat.progress == {"percent": 55.0, "message": "while locked", "metadata": {}}
    assert beat.heartbeat_at is not None and beat.heartbeat_at > before
    release.set()
    for job_id in (locked.id, other.id):
        done = await wait_until(lambda i=job_id: _job_where(client, i,
                                                   lambda j: j.state is S.Completed))
        assert done.attempt == 1
