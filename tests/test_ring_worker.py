"""The worker on the append-only lane (migration 0020; docs/storage.md).

With the lane taking inserts, a plain job lives as ring rows: the worker claims
it with its receipt slot, completes it with a closure, heartbeats it with
heartbeat rows, and moves it to the mutable lane (awa.jobs) before anything else
is written for it: a failure, a retry, progress, a callback. These tests run
each path through a real worker and check what the database then holds.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import timedelta

import asyncpg
import pytest
from tests.helpers import FAST, wait_until

import awa
from awa.db.queries import queries
from awa.worker.completion import Completer

TERMINAL = {awa.JobState.Completed, awa.JobState.Failed, awa.JobState.Cancelled}


@dataclass
class Work:
    n: int
    mode: str = "ok"


@pytest.fixture
async def ring(conn: asyncpg.Connection) -> asyncpg.Connection:
    """The test database's plain jobs go to the append-only lane."""
    await conn.execute(queries()["ring_enqueue_set"], True)
    return conn


async def _finished(client: awa.AsyncClient, ids: list[int]) -> list[awa.Job]:
    async def check() -> list[awa.Job] | None:
        jobs = [await client.get_job(i) for i in ids]
        return jobs if all(j.state in TERMINAL for j in jobs) else None
    result: list[awa.Job] = await wait_until(check, message="jobs to finish")
    return result


async def test_plain_jobs_go_to_the_ring_and_complete_there(
        client: awa.AsyncClient, ring: asyncpg.Connection) -> None:
    """A plain job is a ready row, then a receipt and a closure; the finished job
    is in awa.jobs_done with its output, and awa.jobs never held it."""
    @client.task(Work)
    async def handle(job: awa.JobContext) -> awa.Output:
        return awa.Output({"n": job.args.n})

    ids = [(await client.insert(Work(i))).id for i in range(20)]
    ids += [j.id for j in await client.insert_many([Work(i) for i in range(20, 25)])]
    ids.append((await client.insert(Work(99), unique_opts={})).id)  # unique: mutable lane
    assert await ring.fetchval("SELECT count(*) FROM awa.ready") == 25
    assert (await client.get_job(ids[0])).state is awa.JobState.Available
    await client.start([{"name": "default", "max_workers": 4}], **FAST)
    jobs = await _finished(client, ids)
    await client.shutdown()
    assert [j.state for j in jobs] == [awa.JobState.Completed] * 26
    assert [j.output for j in jobs[:25]] == [{"n": i} for i in range(25)]
    assert all(j.attempt == 1 for j in jobs)
    assert await ring.fetchval("SELECT count(*) FROM awa.closures "
                               "WHERE outcome = awa.ring_outcome('completed')") == 25
    assert await ring.fetchval("SELECT count(*) FROM awa.jobs") == 0


async def test_every_other_outcome_is_written_in_the_mutable_lane(
        client: awa.AsyncClient, ring: asyncpg.Connection) -> None:
    """Retry, snooze, failure for good and a handler's progress move the attempt
    to awa.jobs (a `moved` closure), and carry on there as before."""
    seen: dict[int, int] = {}
    checkpoint: list[object] = []

    @client.task(Work)
    async def handle(job: awa.JobContext) -> object:
        seen[job.args.n] = seen.get(job.args.n, 0) + 1
        if job.args.mode == "retry" and job.attempt == 1:
            return awa.RetryAfter(0.05)
        if job.args.mode == "snooze" and seen[job.args.n] == 1:
            return awa.Snooze(0.05)
        if job.args.mode == "fail":
            raise awa.TerminalError("no")
        if job.args.mode == "progress":
            if job.attempt == 1:
                job.set_progress(50, "half")
                await job.flush_progress()
                return awa.RetryAfter(0.05)
            checkpoint.append(job.progress)  # progress survives the retry
        return None

    modes = ["retry", "snooze", "fail", "progress"]
    ids = [(await client.insert(Work(i, m), max_attempts=3)).id for i, m in enumerate(modes)]
    await client.start([{"name": "default", "max_workers": 4}], **FAST)
    jobs = await _finished(client, ids)
    await client.shutdown()
    assert [j.state for j in jobs] == [awa.JobState.Completed, awa.JobState.Completed,
                                       awa.JobState.Failed, awa.JobState.Completed]
    assert jobs[0].attempt == 2 and jobs[1].attempt == 1
    assert [p["percent"] for p in checkpoint] == [50]  # type: ignore[index]
    moved = await ring.fetch("SELECT id FROM awa.closures "
                             "WHERE outcome = awa.ring_outcome('moved') ORDER BY id")
    assert [r["id"] for r in moved] == ids  # each moved once, from its first attempt


async def test_a_stale_completion_of_a_rescued_ring_attempt_writes_nothing(
        client: awa.AsyncClient, ring: asyncpg.Connection) -> None:
    """Rescue moves a silent ring attempt to awa.jobs and puts it back; the lost
    worker's completion then finds the attempt closed and changes nothing."""
    job = await client.insert(Work(1))
    pool = await client.pool()
    q = queries()
    claimed = (await pool.fetch(q["attempt_claim"], "default", 1, 0.0, 0.0))[0]
    assert claimed["receipt_slot"] is not None
    await ring.execute("UPDATE awa.receipts SET claimed_at = now() - interval '1 hour'")
    assert await ring.fetchval(q["ring_rescue"], timedelta(seconds=30), 10) == 1
    rows = await ring.fetch(q["job_rescue_running"], timedelta(seconds=30), 10,
                            timedelta(days=1), None, [])
    assert [r["id"] for r in rows] == [job.id]
    assert (await client.get_job(job.id)).state is awa.JobState.Retryable
    completer = Completer(pool, q, completed_retention=timedelta(days=1),
                          failed_retention=timedelta(days=1))
    completer.start()
    try:
        done = completer.complete(job.id, claimed["run_lease"], wait=True,
                                  slot=claimed["receipt_slot"])
        assert done is not None and await done is False
    finally:
        await completer.stop()
    assert (await client.get_job(job.id)).state is awa.JobState.Retryable


async def test_heartbeats_keep_a_long_ring_attempt_and_the_ring_moves_on(
        client: awa.AsyncClient, ring: asyncpg.Connection) -> None:
    """A ring attempt longer than the staleness limit is kept alive by heartbeat
    rows (rescue leaves it alone), and the ring's upkeep truncates what is spent
    without touching it."""
    release = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.JobContext) -> None:
        if job.args.mode == "long":
            await release.wait()

    long = await client.insert(Work(0, "long"))
    quick = [(await client.insert(Work(i))).id for i in range(1, 6)]
    await client.start([{"name": "default", "max_workers": 2}], **FAST)
    await _finished(client, quick)
    stale = 3 * FAST["heartbeat_staleness_ms"] / 1000
    await asyncio.sleep(stale)  # well past staleness: only its heartbeats keep it
    assert (await client.get_job(long.id)).state is awa.JobState.Running
    assert await ring.fetchval("SELECT count(*) FROM awa.heartbeats WHERE id = $1",
                               long.id) > 0
    # Two turns of the ring: the quick jobs' slot is reclaimed, the long attempt stays.
    for _ in range(2):
        assert await ring.fetchval(queries()["ring_advance"]) is not None
    from awa.maintenance.ring import RingKeeper
    keeper = RingKeeper(await client.pool(), queries(), timedelta(seconds=30), lambda: True)
    await keeper.reclaim()
    job = await client.get_job(long.id)
    assert job.state is awa.JobState.Running and job.run_lease == 1
    release.set()
    assert (await _finished(client, [long.id]))[0].state is awa.JobState.Completed
    await client.shutdown()


async def test_a_claim_refuses_to_run_in_repeatable_read(
        client: awa.AsyncClient, ring: asyncpg.Connection) -> None:
    """One snapshot for a whole claim would not see the claim committed before it
    took the lock: awa.claim refuses any isolation level but READ COMMITTED."""
    await client.insert(Work(1))
    async with ring.transaction(isolation="repeatable_read"):
        with pytest.raises(asyncpg.PostgresError, match="READ COMMITTED"):
            await ring.fetch(queries()["attempt_claim"], "default", 1, 0.0, 0.0)


async def test_the_switch_decides_where_plain_jobs_go(database_url: str,
                                                     client: awa.AsyncClient,
                                                     conn: asyncpg.Connection) -> None:
    """`awa storage ring on|off` (and `set_ring_enqueue`) decide where the next plain
    jobs go; `storage status` says which; a non-bool is refused before any write."""
    from tests.test_cli import awa_cli

    assert awa_cli(database_url, "storage", "ring", "on").returncode == 0
    assert json.loads(awa_cli(database_url, "storage", "status").stdout)["ring_enqueue"]
    ring_job = await client.insert(Work(1))
    await client.set_ring_enqueue(False)
    assert json.loads(await client.storage_status())["ring_enqueue"] is False
    mutable_job = await client.insert(Work(2))
    assert await conn.fetchval("SELECT count(*) FROM awa.ready WHERE id = $1", ring_job.id) == 1
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs WHERE id = $1",
                               mutable_job.id) == 1
    with pytest.raises(awa.ValidationError, match="on"):
        await client.set_ring_enqueue("yes")  # type: ignore[arg-type]


async def test_a_keyed_queue_claims_its_ring_jobs_and_takes_turns(
        client: awa.AsyncClient, ring: asyncpg.Connection) -> None:
    """A queue that claims with keys (worker/keyed.py) also claims its plain jobs,
    which are ring jobs the keyed statements cannot see: through awa.claim, with
    their receipt slots. While ring jobs wait behind a batch the keyed jobs
    filled, the next claim takes ring jobs first, so neither kind waits for the
    other's backlog to drain; and a worker on such a queue runs both kinds."""
    from awa.worker.keyed import KeyedClaims

    await client.enqueue_many_copy([Work(i) for i in range(20)],
                                   opts=[{"concurrency_key": f"k{i:02d}"} for i in range(20)])
    plain = [j.id for j in await client.insert_many([Work(100 + i) for i in range(3)])]
    assert await ring.fetchval("SELECT count(*) FROM awa.ready") == 3
    claims = KeyedClaims(queries(), configured=True)
    first = await claims.claim(ring, "default", 8, 0.0, 0.0)
    assert [r["concurrency_key"] is not None for r in first] == [True] * 8
    assert claims.ring_waiting and claims.mixed  # the probe saw the ring's jobs
    second = await claims.claim(ring, "default", 8, 0.0, 0.0)
    assert sorted(r["id"] for r in second if r["concurrency_key"] is None) == sorted(plain)
    assert all(r["receipt_slot"] is not None for r in second if r["concurrency_key"] is None)
    assert sum(r["concurrency_key"] is not None for r in second) == 5
    assert not claims.ring_waiting
    # Those attempts are ring attempts (open receipts), not awa.jobs rows.
    assert await ring.fetchval("SELECT count(*) FROM awa.jobs WHERE id = ANY($1)", plain) == 0
    assert await ring.fetchval("SELECT count(*) FROM awa.ring_jobs_running "
                               "WHERE id = ANY($1)", plain) == 3

    @client.task(Work, queue="tenants")
    async def handle(job: awa.JobContext) -> awa.Output:
        return awa.Output({"n": job.args.n})

    keyed = await client.insert_many_copy([Work(i, "keyed") for i in range(4)],
                                          concurrency_key="t", max_in_flight=2,
                                          queue="tenants")
    more = [(await client.insert(Work(200 + i), queue="tenants")).id for i in range(4)]
    assert await ring.fetchval("SELECT count(*) FROM awa.ready WHERE id = ANY($1)", more) == 4
    await client.start(queues=[{"name": "tenants", "max_workers": 4,
                                "key_max_in_flight": 2}], **FAST)
    done = await _finished(client, [j.id for j in keyed] + more)
    assert all(j.state is awa.JobState.Completed for j in done)
    # The ring jobs were completed in the ring (a closure each), never moved.
    assert await ring.fetchval("SELECT count(*) FROM awa.closures WHERE id = ANY($1) "
                               "AND outcome = awa.ring_outcome('completed')", more) == 4
