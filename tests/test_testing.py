"""The testing harness behaves like the runtime, staged follow-ups included."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
import pytest

import awa
import awa.core.states
from awa.testing import AwaTestClient, HandlerJob, JobRow, NoJob


@dataclass
class Resolve:
    n: int


@dataclass
class Notify:
    item: int


async def test_work_one_outcomes(awa_client: AwaTestClient) -> None:
    async def handler(job: awa.JobContext) -> object:
        return {1: None, 2: awa.RetryAfter(60), 3: awa.Snooze(60), 4: awa.Cancel("x"),
                5: None}[job.args.n] if job.args.n != 5 else _fail()

    for n in range(1, 6):
        await awa_client.insert(Resolve(n))
    results = [await awa_client.work_one(Resolve, handler) for _ in range(5)]
    assert [r.outcome for r in results] == ["completed", "retryable", "snoozed", "cancelled",
                                            "failed"]
    assert results[0].is_completed() and results[1].is_retryable() and results[2].is_snoozed()
    assert results[3].is_cancelled() and results[4].is_failed()
    assert results[4].error is not None and "TerminalError: nope" in results[4].error
    assert isinstance(results[0].job, JobRow) and results[0].job.state == "completed"
    assert results[0].job.snapshot is not None
    assert results[0].job.snapshot.state is awa.JobState.Completed
    assert results[2].job.state == "scheduled"  # type: ignore[union-attr]
    empty = await awa_client.work_one(Resolve, handler)
    assert empty.is_no_job() and empty.job is NoJob and not empty.job


def _fail() -> None:
    raise awa.TerminalError("nope")


async def test_work_one_applies_staging_rules(awa_client: AwaTestClient,
                                              conn: asyncpg.Connection) -> None:
    async def handler(job: awa.JobContext) -> object:
        job.enqueue_on_completion(Notify(job.args.n), unique_opts={})
        if job.args.n == 2:
            return awa.RetryAfter(60)  # discarded
        if job.args.n == 3:
            try:
                job.enqueue_on_completion(Notify(0), max_attempts=0)
            except awa.StagingError:
                pass  # swallowed: still poisons
        return None

    for n in (1, 1, 2, 3):
        await awa_client.insert(Resolve(n))
    results = [await awa_client.work_one(Resolve, handler) for _ in range(4)]
    assert [r.outcome for r in results] == ["completed", "completed", "retryable", "failed"]
    assert "StagingError" in (results[3].error or "")
    rows = await conn.fetch("SELECT args FROM awa.jobs_all WHERE kind = 'notify' ORDER BY id")
    assert [r["args"] for r in rows] == [{"item": 1}]  # deduplicated; others discarded


async def test_drain_runs_follow_ups_and_scheduled(awa_client: AwaTestClient) -> None:
    client = awa_client.client
    ran: list[str] = []

    @client.task(Resolve)
    async def resolve(job: awa.JobContext) -> None:
        ran.append(f"resolve:{job.args.n}")
        job.enqueue_on_completion(Notify(job.args.n))

    @client.task(Notify)
    async def notify(job: awa.JobContext) -> object:
        ran.append(f"notify:{job.args.item}")
        return awa.RetryAfter(600) if job.attempt == 1 and job.args.item == 2 else None

    await awa_client.insert(Resolve(1))
    await awa_client.insert(Resolve(2))
    results = await awa_client.drain()
    assert sorted(ran) == ["notify:1", "notify:2", "resolve:1", "resolve:2"]
    assert [r.outcome for r in results].count("retryable") == 1
    ran.clear()
    again = await awa_client.drain(include_scheduled=True)
    assert ran == ["notify:2"] and again[0].is_completed()


async def test_drain_with_scheduled_waits_for_parents(awa_client: AwaTestClient) -> None:
    """Children parked for their parents ran first, and despite a failing parent,
    once include_scheduled made every scheduled job due (issue 40)."""
    client = awa_client.client
    ran: list[str] = []

    @client.task(Resolve)
    async def resolve(job: awa.JobContext) -> None:
        ran.append(f"resolve:{job.args.n}")
        if job.args.n < 0:
            raise RuntimeError("parent fails")

    @client.task(Notify)
    async def notify(job: awa.JobContext) -> None:
        ran.append(f"notify:{job.args.item}")

    failing = await awa_client.insert(Resolve(-1), max_attempts=2)
    doomed = await awa_client.insert(Notify(-1), after=[failing])
    fine = await awa_client.insert(Resolve(1))
    child = await awa_client.insert(Notify(1), after=[fine])
    await awa_client.drain(include_scheduled=True)
    assert ran.count("resolve:-1") == 2 and "notify:-1" not in ran
    assert ran.index("resolve:1") < ran.index("notify:1")
    assert (await client.get_job(failing.id)).state is awa.JobState.Failed
    assert (await client.get_job(doomed.id)).state is awa.JobState.Cancelled
    assert (await client.get_job(child.id)).state is awa.JobState.Completed


async def test_clean_empties_the_schema(awa_client: AwaTestClient) -> None:
    await awa_client.insert(Resolve(1), unique_opts={})
    await awa_client.client.pause_queue("default")
    await awa_client.clean()
    assert await awa_client.client.list_jobs() == []
    await awa_client.insert(Resolve(1), unique_opts={})
    assert not any(s.paused for s in await awa_client.client.queue_stats())


def test_handler_job_records_validated_requests() -> None:
    job = HandlerJob(Resolve(1), id=7, attempt=2, max_attempts=5, metadata={"a": 1})
    job.enqueue_on_completion(Notify(1), queue="notify", unique_opts={})
    job.enqueue_on_completion({"item": 2}, kind="notify", metadata={"from": 7})
    assert [(s.kind, s.queue, s.args) for s in job.staged] == [
        ("notify", "notify", {"item": 1}), ("notify", "default", {"item": 2})]
    assert job.staged[0].unique_key is not None and job.staged[1].unique_key is None
    with pytest.raises(awa.StagingError) as info:
        job.enqueue_on_completion(Notify(3), priority=0)
    assert isinstance(info.value.__cause__, awa.ValidationError)
    with pytest.raises(awa.StagingError):
        job.enqueue_on_completion({"item": 1})  # a dict needs kind=
    with pytest.raises(TypeError):
        job.enqueue_on_completion(Notify(1), colour="red")  # type: ignore[call-arg]
    for i in range(awa.core.states.STAGED_FOLLOW_UPS_MAX - 2):
        job.enqueue_on_completion(Notify(i))
    with pytest.raises(awa.StagingError, match="at most 16"):
        job.enqueue_on_completion(Notify(99))
    big = HandlerJob(Resolve(1))
    with pytest.raises(awa.StagingError, match="bytes"):
        big.enqueue_on_completion({"pad": "x" * 70_000}, kind="notify")
    sealed = HandlerJob(Resolve(1))
    sealed.seal()
    with pytest.raises(awa.StagingError, match="after the handler returned"):
        sealed.enqueue_on_completion(Notify(1))
    assert not job.is_cancelled()


async def test_work_one_discards_staged_on_every_other_outcome(
        awa_client: AwaTestClient, conn: asyncpg.Connection,
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    async def handler(job: awa.JobContext) -> object:
        job.enqueue_on_completion(Notify(job.args.n))
        if job.args.n == 1:
            return awa.Snooze(60)
        if job.args.n == 2:
            return awa.Cancel("no")
        if job.args.n == 3:
            raise RuntimeError("handler error")
        return awa.WaitForCallback(await job.register_callback())

    caplog.set_level(logging.WARNING, logger="awa.runtime")
    for n in (1, 2, 3, 4):
        await awa_client.insert(Resolve(n))
    results = [await awa_client.work_one(Resolve, handler) for _ in range(4)]
    assert [r.outcome for r in results] == ["snoozed", "cancelled", "retryable",
                                            "waiting_external"]
    assert results[3].is_waiting()
    assert any("staged follow-ups" in r.message for r in caplog.records)
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_all WHERE kind = 'notify'") == 0


async def test_completed_rows_store_less_and_read_back_whole(
        awa_client: AwaTestClient, conn: asyncpg.Connection) -> None:
    """Migration 0016: a completed row drops heartbeat/deadline and stores empty
    tags/metadata as NULL (less WAL); readers still see [] and {}; failures keep all."""
    async def handler(job: awa.JobContext) -> object:
        return None if job.args.n == 1 else _fail()

    done = await awa_client.insert(Resolve(1))
    tagged = await awa_client.insert(Resolve(1), tags=["t"])
    failed = await awa_client.insert(Resolve(2))
    for _ in range(3):
        await awa_client.work_one(Resolve, handler)
    rows = {r["id"]: r for r in await conn.fetch(
        "SELECT id, state::text, tags, metadata, heartbeat_at, deadline_at FROM awa.jobs_done")}
    assert rows[done.id]["state"] == "completed"
    assert rows[done.id]["tags"] is None and rows[done.id]["metadata"] is None
    assert rows[done.id]["heartbeat_at"] is None and rows[done.id]["deadline_at"] is None
    assert rows[tagged.id]["tags"] == ["t"]
    assert rows[failed.id]["state"] == "failed" and rows[failed.id]["tags"] == []
    assert rows[failed.id]["heartbeat_at"] is not None
    raw = await conn.fetchrow("SELECT * FROM awa.jobs_done WHERE id = $1", done.id)
    job = awa.Job.from_row(raw)
    assert job.tags == [] and job.metadata == {}
    view = await conn.fetchrow("SELECT tags, metadata FROM awa.jobs_all WHERE id = $1", done.id)
    assert view["tags"] == [] and view["metadata"] == {}
