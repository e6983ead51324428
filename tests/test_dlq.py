"""Dead letter queue and the rest of the admin API."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from tests.helpers import FAST, wait_for_state, wait_until

import awa
from awa.telemetry.signals import Signals

S = awa.JobState


@dataclass
class Charge:
    n: int


async def test_terminal_failures_go_to_the_dlq(client: awa.AsyncClient,
                                               conn: asyncpg.Connection) -> None:
    @client.task(Charge, queue="pay")
    async def pay(job: awa.JobContext) -> object:
        if job.args.n == 1:
            raise awa.TerminalError("card declined")
        if job.args.n == 2:
            raise ValueError("flaky forever")
        if job.args.n == 3:
            return awa.WaitForCallback(await job.register_callback(timeout_seconds=0.2))
        return None

    @client.task(Charge, kind="charge_plain", queue="plain")
    async def plain(job: awa.JobContext) -> None:
        raise awa.TerminalError("no dlq here")

    ids = [(await client.insert(Charge(n), queue="pay", max_attempts=1, tags=["t1"])).id
           for n in (1, 2, 3)]
    unknown = await client.insert({"x": 1}, kind="nobody", queue="pay", max_attempts=1)
    plain_job = await client.insert(Charge(9), kind="charge_plain", queue="plain")
    await client.start([{"name": "pay", "max_workers": 2, "dlq_enabled": True},
                        {"name": "plain", "max_workers": 1}], **FAST)

    async def all_dead() -> bool:
        return await client.dlq_depth(queue="pay") == 4
    await wait_until(all_dead, timeout=20)
    await wait_for_state(client, plain_job.id, S.Failed)
    entries = {e.job.id: e for e in await client.list_dlq(queue="pay")}
    assert entries[ids[0]].reason == "terminal_error"
    assert entries[ids[1]].reason == "max_attempts_exhausted"
    assert entries[ids[2]].reason == "callback_timeout"
    assert entries[unknown.id].reason == "max_attempts_exhausted"  # no handler, ever
    first = entries[ids[0]]
    assert first.job.args == {"n": 1} and first.job.tags == ["t1"]
    assert first.job.state is S.Failed and first.original_run_lease == 1
    assert "card declined" in first.job.errors[-1]["error"]
    assert (await client.get_job(ids[0])).state is S.Failed  # get_job finds DLQ jobs
    assert await client.get_dlq_job(plain_job.id) is None  # not a DLQ queue
    assert await client.dlq_depth() == 4
    assert await client.dlq_depth_by_queue() == {"pay": 4}
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_done WHERE queue = 'pay'") == 0


async def test_dlq_default_and_round_trip(client: awa.AsyncClient) -> None:
    @client.task(Charge, queue="q")
    async def handle(job: awa.JobContext) -> None:
        if not job.errors:  # only the very first attempt ever
            raise awa.TerminalError("first attempt fails")

    jobs = [await client.insert(Charge(n), queue="q", tags=[f"tag{n % 2}"],
                                metadata={"m": n}) for n in range(4)]
    await client.start([("q", 4)], dlq_enabled_by_default=True, **FAST)

    async def dead() -> bool:
        return await client.dlq_depth() == 4
    await wait_until(dead)
    # List: newest first, filters, stable cursor.
    page1 = await client.list_dlq(limit=2)
    page2 = await client.list_dlq(limit=2, before_id=page1[-1].job.id)
    assert [e.job.id for e in page1 + page2] == sorted((j.id for j in jobs), reverse=True)
    assert [e.job.args["n"] for e in await client.list_dlq(tag="tag1")] == [3, 1]
    assert await client.list_dlq(kind="nope") == []
    # Retry one, into another queue at a later time with a new priority.
    later = datetime.now(UTC) + timedelta(hours=1)
    moved = await client.retry_from_dlq(jobs[0].id, queue="elsewhere", priority=1, run_at=later)
    assert moved is not None and moved.state is S.Scheduled and moved.queue == "elsewhere"
    assert moved.priority == 1 and moved.attempt == 0 and moved.tags == ["tag0"]
    assert moved.metadata == {"m": 0} and len(moved.errors) == 1  # history kept
    assert await client.retry_from_dlq(jobs[0].id) is None  # no longer in the DLQ
    # Bulk retry: guarded, then runs; the retried jobs complete on their 2nd attempt.
    with pytest.raises(awa.ValidationError, match="allow_all"):
        await client.bulk_retry_from_dlq()
    assert await client.bulk_retry_from_dlq(tag="tag1") == 2
    for j in (jobs[1], jobs[3]):
        await wait_for_state(client, j.id, S.Completed)
    assert await client.dlq_depth() == 1
    # Purge.
    assert await client.purge_dlq_job(jobs[2].id) is True
    assert await client.purge_dlq_job(jobs[2].id) is False
    with pytest.raises(awa.JobNotFound):
        await client.get_job(jobs[2].id)


async def test_move_failed_and_purge_guards(client: awa.AsyncClient) -> None:
    @client.task(Charge)
    async def handle(job: awa.JobContext) -> None:
        raise awa.TerminalError("x")

    jobs = [await client.insert(Charge(n), tags=["a"] if n else ["b"]) for n in range(3)]
    await client.start([("default", 3)], **FAST)
    for j in jobs:
        await wait_for_state(client, j.id, S.Failed)
    entry = await client.move_failed_to_dlq(jobs[0].id, "operator said so")
    assert entry is not None and entry.reason == "operator said so"
    assert await client.move_failed_to_dlq(jobs[0].id) is None
    with pytest.raises(awa.ValidationError):
        await client.bulk_move_failed_to_dlq()
    assert await client.bulk_move_failed_to_dlq(kind="charge") == 2
    assert {e.reason for e in await client.list_dlq()} == {"operator said so", "manual"}
    with pytest.raises(awa.ValidationError, match="allow_all"):
        await client.purge_dlq()
    assert await client.purge_dlq(tag="a") == 2
    assert await client.purge_dlq(allow_all=True) == 1


async def test_retry_failed_discard_failed_dump_run(client: awa.AsyncClient) -> None:
    @client.task(Charge)
    async def handle(job: awa.JobContext) -> None:
        if job.args.n >= 0:
            raise ValueError(f"attempt {job.attempt} broke")

    jobs = [await client.insert(Charge(n), max_attempts=2) for n in range(3)]
    other = await client.insert({"n": -1}, kind="other_kind", max_attempts=1)
    await client.start([("default", 3)], **{**FAST, "poll_interval_ms": 20})
    for j in jobs:
        await wait_for_state(client, j.id, S.Failed, timeout=20)
    run1 = json.loads(await client.dump_run(jobs[0].id, 1))
    assert run1["attempt"] == 1 and "attempt 1 broke" in run1["error"]
    latest = json.loads(await client.dump_run(jobs[0].id))
    assert latest["attempt"] == 2 and "attempt 2 broke" in latest["error"]
    with pytest.raises(awa.ValidationError):
        await client.dump_run(jobs[0].id, 5)
    with pytest.raises(awa.ValidationError, match="exactly one"):
        await client.retry_failed()
    await client.shutdown()
    result = await client.retry_failed(kind="charge")
    assert result.matched == 3 and {j.state for j in result.jobs} == {S.Available}
    assert all(j.attempt == 0 for j in result.jobs)
    await wait_for_state(client, other.id, S.Failed)
    assert await client.discard_failed("other_kind") == 1
    with pytest.raises(awa.JobNotFound):
        await client.get_job(other.id)


async def test_cancel_running_job_is_seen_promptly(client: awa.AsyncClient,
                                                  signals: Signals) -> None:
    seen = asyncio.Event()

    @client.task(Charge)
    async def handle(job: awa.JobContext) -> None:
        while not job.is_cancelled():
            await asyncio.sleep(0.005)
        seen.set()
        # a late result after cancellation changes nothing

    job = await client.insert(Charge(1))
    # A long heartbeat interval: only the NOTIFY can tell the handler quickly.
    await client.start([("default", 1)], **{**FAST, "heartbeat_interval_ms": 60_000,
                                            "heartbeat_staleness_ms": 120_000})
    await wait_for_state(client, job.id, S.Running)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await client.cancel(job.id)
    await asyncio.wait_for(seen.wait(), timeout=5)
    assert loop.time() - t0 < 2.0
    await signals.outcome(job.id)  # the handler's late completion, found stale
    assert (await client.get_job(job.id)).state is S.Cancelled


async def test_retry_failed_with_an_empty_name_is_refused(client: awa.AsyncClient) -> None:
    """retry_failed(kind='') was read as 'no filter' and retried every failed job."""
    for bad in ({"kind": ""}, {"queue": ""}):
        try:
            await client.retry_failed(**bad)
        except awa.ValidationError as exc:
            assert exc.field in ("kind", "queue")
        else:
            raise AssertionError(f"retry_failed({bad}) was accepted")
