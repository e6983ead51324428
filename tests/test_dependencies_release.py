"""Releasing children at scale, and what an open producer transaction may hold up
(issue 40, items 2 and 3)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from tests.helpers import FAST, TO_MUTABLE, wait_for_state, wait_until

import awa
from awa.db.queries import queries
from awa.maintenance.services import DependencyReleaser, Rescuer
from awa.worker import completion

S = awa.JobState


async def _finish(conn: asyncpg.Connection, job_id: int, state: str = "completed") -> None:
    """Finish an active job the way the runtime's statements do (a move to jobs_done)."""
    await conn.execute(TO_MUTABLE, job_id)  # a ring job moves to awa.jobs first
    await conn.execute(
        "WITH moved AS (DELETE FROM awa.jobs j WHERE j.id = $1 RETURNING j) "
        "INSERT INTO awa.jobs_done SELECT f.* FROM moved m, "
        "LATERAL awa.finished(m.j, $2::awa.job_state, interval '1 hour') f", job_id, state)


async def _count(conn: asyncpg.Connection, sql: str, *args: Any) -> int:
    return int(await conn.fetchval(sql, *args))


# -- item 2: an open producer transaction holds up only its parent's completion -----------


async def test_open_producer_transaction_holds_up_only_its_parents_completion(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction that inserted a child after a running parent stays open: the
    parent's handler returns meanwhile, other jobs complete promptly, and the
    parent completes (once, on its first attempt) when the transaction commits."""
    monkeypatch.setattr(completion, "BATCH_WAIT", 1.0)
    monkeypatch.setattr(completion, "ALONE_WAIT", 0.5)
    gate = asyncio.Event()
    runs: list[int] = []

    @client.task(kind="gated", queue="deps")
    async def gated(job: awa.Job) -> None:
        runs.append(job.id)
        if job.args.get("wait"):
            await gate.wait()

    parent = await client.insert({"wait": True}, kind="gated", queue="deps")
    # Rescue is not what this races: a heartbeat round held up past FAST's 0.6 s
    # staleness on a loaded machine rescued the parent (attempt 2) in a CI run.
    await client.start([("deps", 8)], **{**FAST, "heartbeat_staleness_ms": 10_000})
    await wait_until(lambda: asyncio.sleep(0, parent.id in runs),
                     message="the parent to run")
    producer = awa.AsyncClient(database_url)
    try:
        async with producer.transaction() as tx:
            child = await tx.insert({}, kind="gated", queue="deps", after=[parent])
            gate.set()  # the parent's handler returns; its row is held by this transaction
            others = [(await client.insert({"n": i}, kind="gated", queue="deps")).id
                      for i in range(30)]

            async def others_done() -> bool:
                return await _count(conn, "SELECT count(*) FROM awa.jobs_done "
                                    "WHERE id = ANY($1) AND state = 'completed'",
                                    others) == len(others)
            # Without the fix the batch holding the parent waited 30 s, then retried.
            await wait_until(others_done, timeout=20,
                             message="the other jobs to complete while the insert is open")
            assert (await client.get_job(parent.id)).state is S.Running
        done = await wait_for_state(client, parent.id, S.Completed, timeout=30)
        await wait_for_state(client, child.id, S.Completed, timeout=30)
    finally:
        await producer.close()
    assert done.attempt == 1
    assert runs.count(parent.id) == 1 and runs.count(child.id) == 1


# -- item 3: large fan-outs in chunks; rescue isolated from one bad job -------------------


@pytest.mark.parametrize("outcome", ["completed", "failed"])
async def test_a_large_fan_out_is_released_in_chunks_exactly_once(
        client: awa.AsyncClient, conn: asyncpg.Connection, outcome: str) -> None:
    """3,000 children: the parent's finish releases 1,000, two release services
    running at once do the rest in chunks of 150, each child exactly once; a
    grandchild follows its cancelled parent through a release row of its own."""
    n = 3000
    parent = await client.insert({}, kind="p")
    inserted = await client.enqueue_many_copy([{"i": i} for i in range(n)], kind="c",
                                              after=[parent])
    assert inserted == n
    last = await conn.fetchval("SELECT max(id) FROM awa.jobs WHERE kind = 'c'")
    grandchild = await client.insert({}, kind="g", after=[last])
    await _finish(conn, parent.id, outcome)
    released = "available" if outcome == "completed" else "cancelled"
    count_sql = "SELECT count(*) FROM awa.jobs_all WHERE kind = 'c' AND state::text = $1"
    assert await _count(conn, count_sql, released) == 1000
    assert await _count(conn, "SELECT count(*) FROM awa.dependency_releases") == 1

    pool = await client.pool()
    one = DependencyReleaser(pool, queries(), timedelta(seconds=1), chunk_size=150)
    other_pool = await asyncpg.create_pool(client._url, min_size=1, max_size=2)
    try:
        two = DependencyReleaser(other_pool, queries(), timedelta(seconds=1), chunk_size=150)
        await asyncio.gather(one.run_once(), two.run_once())
        await one.run_once()  # whatever the other one's pass left when it ended
    finally:
        await other_pool.close()
    assert one.chunks + two.chunks >= 14  # 2,000 children in chunks of 150
    assert await _count(conn, count_sql, released) == n
    assert await _count(conn, "SELECT count(*) FROM awa.job_dependencies "
                        "WHERE resolved_at IS NULL") == (1 if outcome == "completed" else 0)
    assert await _count(conn, "SELECT count(*) FROM awa.job_dependencies "
                        "WHERE parent_id = $1 AND parent_state::text = $2",
                        parent.id, outcome) == n
    assert await _count(conn, "SELECT count(*) FROM awa.dependency_releases") == 0
    assert await _count(conn, "SELECT count(*) FROM awa.jobs WHERE kind = 'c' "
                        "AND run_at > now() + interval '1 year'") == 0
    expected = S.Scheduled if outcome == "completed" else S.Cancelled
    assert (await client.get_job(grandchild.id)).state is expected


async def test_a_worker_releases_a_large_fan_out(client: awa.AsyncClient,
                                                conn: asyncpg.Connection) -> None:
    """End to end: a worker runs the parent and all 2,500 children, each once."""
    runs: list[int] = []

    @client.task(kind="fan", queue="fan")
    async def fan(job: awa.Job) -> None:
        runs.append(job.id)

    parent = await client.insert({"root": True}, kind="fan", queue="fan")
    await client.enqueue_many_copy([{"i": i} for i in range(2500)], kind="fan", queue="fan",
                                   after=[parent])
    await client.start([("fan", 16)], **FAST)
    await wait_until(lambda: asyncio.sleep(0, len(runs) >= 2501), timeout=120,
                     message="the parent and every child to run")
    assert len(runs) == len(set(runs)) == 2501
    await wait_until(lambda: _empty_releases(conn), message="the release row to go")


async def _empty_releases(conn: asyncpg.Connection) -> bool:
    return await _count(conn, "SELECT count(*) FROM awa.dependency_releases") == 0


async def test_producer_after_a_finished_parent_releases_only_its_own_children(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """A child inserted after a parent whose release is still in progress is released
    at once, and the insert leaves the rest of that release to the service."""
    parent = await client.insert({}, kind="p")
    await client.enqueue_many_copy([{"i": i} for i in range(1500)], kind="c", after=[parent])
    await _finish(conn, parent.id)
    late = await client.insert({}, kind="late", after=[parent])
    assert late.state is S.Available
    assert await _count(conn, "SELECT count(*) FROM awa.jobs WHERE kind = 'c' "
                        "AND state = 'available'") == 1000
    await DependencyReleaser(await client.pool(), queries(), timedelta(seconds=1)).run_once()
    assert await _count(conn, "SELECT count(*) FROM awa.jobs WHERE kind = 'c' "
                        "AND state = 'available'") == 1500


async def test_one_jobs_failing_rescue_leaves_the_others_rescued(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """A job whose rescue fails (here a trigger the test installs) is quarantined:
    twenty other dead jobs and an expired callback are rescued in the same pass,
    and the bad job is rescued once its statement works again."""
    q = queries()
    pool = await client.pool()
    bad = await client.insert({}, kind="bad")
    good = [(await client.insert({"n": i}, kind="good")).id for i in range(20)]
    waiting = await client.insert({}, kind="callback")
    claimed = await pool.fetch(q["attempt_claim"], "default", 30, 0.0, 60.0)
    assert len(claimed) == 22
    for row in claimed:
        await conn.execute(TO_MUTABLE, row["id"])  # setup: ring attempts to awa.jobs
    await conn.execute("UPDATE awa.jobs SET heartbeat_at = now() - interval '1 hour' "
                       "WHERE kind <> 'callback'")
    await conn.execute("UPDATE awa.jobs SET state = 'waiting_external', "
                       "callback_id = gen_random_uuid(), "
                       "callback_timeout_at = now() - interval '1 minute' WHERE id = $1",
                       waiting.id)
    await conn.execute("""
        CREATE FUNCTION public.fail_bad() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF OLD.kind = 'bad' THEN RAISE EXCEPTION 'injected failure'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER fail_bad BEFORE UPDATE ON awa.jobs
            FOR EACH ROW EXECUTE FUNCTION public.fail_bad();""")
    rescuer = Rescuer(pool, q, timedelta(seconds=1), lambda: True,
                      staleness=timedelta(seconds=30), failed_retention=timedelta(days=1))
    await rescuer.run_once()
    states = {r["id"]: r["state"] for r in await conn.fetch(
        "SELECT id, state::text AS state FROM awa.jobs")}
    assert all(states[i] == "retryable" for i in good)
    assert states[waiting.id] == "retryable"
    assert states[bad.id] == "running"
    assert rescuer.quarantines["job_rescue_running"].ids == {bad.id}
    await rescuer.run_once()  # still failing alone; nothing else to do
    assert rescuer.quarantines["job_rescue_running"].ids == {bad.id}
    await conn.execute("DROP TRIGGER fail_bad ON awa.jobs")
    await rescuer.run_once()
    assert (await client.get_job(bad.id)).state is S.Retryable
    assert rescuer.quarantines["job_rescue_running"].ids == set()


async def test_testing_drain_runs_every_child_of_a_large_fan_out(
        client: awa.AsyncClient) -> None:
    """`awa.testing`'s drain releases what the parent's finish left, as a worker would."""
    from awa.testing import AwaTestClient
    runs: list[int] = []

    @client.task(kind="fan")
    async def fan(job: awa.Job) -> None:
        runs.append(job.id)

    parent = await client.insert({"root": True}, kind="fan")
    await client.enqueue_many_copy([{"i": i} for i in range(1100)], kind="fan",
                                   after=[parent])
    results = await AwaTestClient(client).drain(max_jobs=5000)
    assert len(results) == 1101
    assert len(runs) == len(set(runs)) == 1101


async def test_an_outcome_held_up_by_an_open_insert_is_not_given_up(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A retry of a parent whose row an open insert holds times out again and again
    (1 s here): it is written when the insert commits, not abandoned after the
    transient-error retries (without the fix: given up after six timeouts)."""
    from awa.core.model import Outcome
    from awa.db.pool import create_pool
    monkeypatch.setattr(completion, "RETRY_DELAYS", (0.01,) * 5)
    q = queries()
    parent = await client.insert({}, kind="p")
    claim = (await (await client.pool()).fetch(q["attempt_claim"], "default", 1, 0.0, 60.0))[0]
    lease, slot = claim["run_lease"], claim["receipt_slot"]  # slot: a ring attempt's
    pool = await create_pool(database_url, max_connections=2, command_timeout=1.0)
    producer = awa.AsyncClient(database_url)
    completer = completion.Completer(pool, q, completed_retention=timedelta(days=1),
                                     failed_retention=timedelta(days=1))
    try:
        async with producer.transaction() as tx:
            child = await tx.insert({}, kind="c", after=[parent])
            write = asyncio.create_task(completer.write(parent.id, lease,
                                                        Outcome("retry", delay=60), slot=slot))
            key = f"outcome write of job {parent.id}"

            async def timed_out_often() -> bool:
                return completion._failures.failures(key) >= 7 or write.done()
            await wait_until(timed_out_often, timeout=30,
                             message="the write to time out seven times")
            assert not write.done()
        assert await asyncio.wait_for(write, 30) is True
    finally:
        await producer.close()
        await pool.close()
    assert (await client.get_job(parent.id)).state is S.Retryable
    assert (await client.get_job(child.id)).state is S.Scheduled
