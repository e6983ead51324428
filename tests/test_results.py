"""Awaitable results: ``client.wait_for`` / ``job.wait`` on every way a job can end.

Wake-ups: by NOTIFY (shown with a poll interval far longer than the test
allows), and by polling behind a transaction-pooling PgBouncer (where LISTEN
cannot work). Jobs nobody waits on send no NOTIFY.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from tests.helpers import FAST, TO_MUTABLE, wait_for_state, wait_until
from tests.pgbouncer import SKIP_REASON, PgBouncer, binary

import awa
from awa.core.results import InsertedJob
from awa.db.queries import queries

#: A poll this slow never fires within a test: a prompt return means NOTIFY woke it.
NO_POLL = 600.0
#: Generous: far below NO_POLL, far above a NOTIFY round trip on a busy machine.
PROMPT = 30.0


@dataclass
class Work:
    n: int


async def _listening(client: awa.AsyncClient) -> None:
    """Start the client's result listener and wait until LISTEN is up."""
    probe = await client.insert(Work(-1), queue="probe")
    with pytest.raises(awa.WaitTimeout):
        await client.wait_for(probe.id, timeout=0)
    assert client._results is not None
    results = client._results
    await wait_until(lambda: _value(results.listening), message="LISTEN on awa_result")


async def _value(value: bool) -> bool:
    return value


async def _only_notify_can_wake(client: awa.AsyncClient) -> None:
    """Wait until the client's poll sleeps NO_POLL: from now on only a NOTIFY
    (or a LISTEN reconnect) wakes a waiter within the test's time."""
    results = client._results
    assert results is not None
    await wait_until(lambda: _value(results._sleeping == NO_POLL), message="the long poll")


def _worker(client: awa.AsyncClient, queue: str = "r") -> None:
    @client.task(Work, queue=queue)
    async def work(job: awa.JobContext) -> object:
        if job.args.n == 1:
            raise awa.TerminalError("boom")
        return awa.Output({"double": job.args.n * 2})


async def test_completed_job_returns_its_output_woken_by_notify(
        client: awa.AsyncClient) -> None:
    _worker(client)
    await _listening(client)
    job = await client.insert(Work(21), queue="r")
    assert isinstance(job, awa.Job) and isinstance(job, InsertedJob)
    assert job == await client.get_job(job.id) and await client.get_job(job.id) == job
    waiting = asyncio.create_task(job.wait(timeout=NO_POLL, poll_interval=NO_POLL))
    await _only_notify_can_wake(client)
    await client.start([("r", 2)], **FAST)
    done = await asyncio.wait_for(waiting, PROMPT)
    assert done.state is awa.JobState.Completed
    assert done.output == {"double": 42}
    assert done.finalized_at is not None
    # The finish deleted the registration: nothing is left behind.
    pool = await client.pool()
    assert await pool.fetchval("SELECT count(*) FROM awa.job_waiters") == 0
    # Waiting on a job that already finished returns it at once.
    again = await client.wait_for(job.id, timeout=0)
    assert again.state is awa.JobState.Completed and again.output == {"double": 42}


async def test_failed_job_returns_failed_with_its_errors(client: awa.AsyncClient) -> None:
    _worker(client)
    job = await client.insert(Work(1), queue="r")
    await client.start([("r", 2)], **FAST)
    done = await client.wait_for(job.id, timeout=PROMPT)
    assert done.state is awa.JobState.Failed
    assert "boom" in done.errors[-1]["error"]


async def test_dead_lettered_job_counts_as_failed(client: awa.AsyncClient) -> None:
    _worker(client, "pay")
    job = await client.insert(Work(1), queue="pay")
    await client.start([{"name": "pay", "max_workers": 2, "dlq_enabled": True}], **FAST)
    done = await job.wait(timeout=PROMPT)
    assert done.state is awa.JobState.Failed
    assert await client.get_dlq_job(job.id) is not None


async def test_cancelled_job_wakes_its_waiter(client: awa.AsyncClient) -> None:
    await _listening(client)
    later = datetime.now(UTC) + timedelta(hours=1)
    job = await client.insert(Work(3), queue="r", run_at=later)
    waiting = asyncio.create_task(client.wait_for(job.id, timeout=NO_POLL,
                                                  poll_interval=NO_POLL))
    pool = await client.pool()
    await wait_until(lambda: pool.fetchval("SELECT count(*) FROM awa.job_waiters"),
                     message="the waiter's registration")
    await _only_notify_can_wake(client)
    await client.cancel(job.id)
    done = await asyncio.wait_for(waiting, PROMPT)
    assert done.state is awa.JobState.Cancelled


async def test_timeout_raises_and_leaves_the_job_alone(client: awa.AsyncClient) -> None:
    job = await client.insert(Work(4), queue="nobody")
    with pytest.raises(awa.WaitTimeout) as caught:
        await job.wait(timeout=0.2)
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.job_id == job.id and caught.value.state == "available"
    assert (await client.get_job(job.id)).state is awa.JobState.Available
    pool = await client.pool()
    assert await pool.fetchval("SELECT count(*) FROM awa.job_waiters") == 0  # unregistered


async def test_the_timeout_holds_while_the_database_does_not_answer(
        client: awa.AsyncClient, database_url: str) -> None:
    """A registration blocked on the job's row (an open transaction holds it)
    still ends at the wait's timeout: no database call outlives it."""
    job = await client.insert(Work(5), queue="nobody")
    holder = await asyncpg.connect(database_url)
    try:
        await holder.execute(TO_MUTABLE, job.id)  # the row to hold is in awa.jobs
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM awa.jobs WHERE id = $1 FOR UPDATE", job.id)
        with pytest.raises(awa.WaitTimeout) as caught:
            await asyncio.wait_for(job.wait(timeout=0.5), 20)  # 20 s: the old hang's bound
        assert caught.value.job_id == job.id
        await tx.rollback()
    finally:
        await holder.close()


async def test_unknown_job_and_bad_arguments(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.JobNotFound):
        await client.wait_for(987654321, timeout=1)
    with pytest.raises(awa.ValidationError, match="timeout"):
        await client.wait_for(1, timeout=-1)
    with pytest.raises(awa.ValidationError, match="poll_interval"):
        await client.wait_for(1, timeout=1, poll_interval=0)
    with pytest.raises(awa.ValidationError, match="job_id"):
        await client.wait_for("1", timeout=1)  # type: ignore[arg-type]


async def test_jobs_nobody_waits_on_send_no_notify(client: awa.AsyncClient,
                                                   database_url: str) -> None:
    seen: list[str] = []
    spy = await asyncpg.connect(database_url)
    await spy.add_listener("awa_result", lambda *a: seen.append(a[3]))
    try:
        _worker(client)
        await client.start([("r", 4)], **FAST)
        plain = await client.insert_many_copy([Work(n) for n in range(10, 30)], queue="r")
        for job in plain:
            await wait_for_state(client, job.id, awa.JobState.Completed)
        await client.pause_queue("r")
        waited = await client.insert(Work(7), queue="r")
        waiting = asyncio.create_task(waited.wait(timeout=PROMPT))
        pool = await client.pool()
        await wait_until(lambda: pool.fetchval("SELECT count(*) FROM awa.job_waiters"),
                         message="the waiter's registration")
        await client.resume_queue("r")
        await waiting
        # Notifications arrive in commit order: the waited job's is the only one.
        await wait_until(lambda: _value(bool(seen)), message="the waited job's NOTIFY")
        assert seen == [str(waited.id)]
    finally:
        await spy.close()


async def test_many_waiters_one_job_and_a_transaction_handle(client: awa.AsyncClient) -> None:
    async with client.transaction() as tx:
        job = await tx.insert(Work(5), queue="r")
    waits = [asyncio.create_task(job.wait(timeout=PROMPT)) for _ in range(3)]
    waits.append(asyncio.create_task(client.wait_for(job.id, timeout=0.1)))
    with pytest.raises(awa.WaitTimeout):
        await waits.pop()  # one waiter giving up keeps the others' registration
    _worker(client)
    await client.start([("r", 2)], **FAST)
    done = await asyncio.gather(*waits)
    assert {d.state for d in done} == {awa.JobState.Completed}


async def test_sync_client_waits(sync_client: awa.Client, client: awa.AsyncClient) -> None:
    job = sync_client.insert(Work(8), queue="r")
    assert isinstance(job, InsertedJob)
    with pytest.raises(awa.AwaError, match="wait_sync"):
        await job.wait(timeout=1)
    _worker(client)
    await client.start([("r", 2)], **FAST)
    done = await asyncio.to_thread(job.wait_sync, PROMPT)
    assert done.state is awa.JobState.Completed and done.output == {"double": 16}
    same = await asyncio.to_thread(sync_client.wait_for, job.id, 1)
    assert same.id == job.id


@pytest.mark.pgbouncer
async def test_polls_behind_a_transaction_pooler(server_url: str, database_url: str) -> None:
    if binary() is None:
        pytest.skip(SKIP_REASON)
    bouncer = PgBouncer(server_url)
    try:
        async with awa.AsyncClient(bouncer.url(database_url)) as client:
            _worker(client)
            job = await client.insert(Work(9), queue="r")
            waiting = asyncio.create_task(job.wait(timeout=PROMPT, poll_interval=0.1))
            await client.start([("r", 2)], **OPTIONS_POOLED)
            done = await waiting
            assert done.state is awa.JobState.Completed and done.output == {"double": 18}
            assert client._results is not None and not client._results.listening
    finally:
        bouncer.stop()


OPTIONS_POOLED = {**FAST, "heartbeat_staleness_ms": 30_000}


async def test_jobs_finishing_while_their_waiters_register(client: awa.AsyncClient) -> None:
    """Waiters registering while a busy worker finishes their jobs: each one either
    reads the finished job or is notified (the registration locks the row its
    finish deletes), so none is left to a poll."""
    await _listening(client)
    parked = await client.insert(Work(0), queue="parked")
    sentinel = asyncio.create_task(parked.wait(timeout=NO_POLL, poll_interval=NO_POLL))
    await _only_notify_can_wake(client)
    _worker(client)
    await client.start([("r", 8)], **FAST)
    waits = []
    for n in range(10, 110):  # each wait registers while the next insert runs
        job = await client.insert(Work(n), queue="r")
        waits.append(asyncio.create_task(job.wait(timeout=NO_POLL, poll_interval=NO_POLL)))
    done = await asyncio.wait_for(asyncio.gather(*waits), PROMPT)
    assert {d.state for d in done} == {awa.JobState.Completed}
    sentinel.cancel()


#: A finish as every finishing statement does it: the active row deleted.
FINISH = """
    WITH moved AS (DELETE FROM awa.jobs j WHERE id = $1 RETURNING j)
    INSERT INTO awa.jobs_done SELECT f.* FROM moved m,
        LATERAL awa.finished(m.j, 'completed', interval '1 day') f"""


async def test_a_finish_in_flight_during_registration_is_not_missed(
        client: awa.AsyncClient, database_url: str) -> None:
    """The race itself, held open: a transaction has finished the job (its trigger
    already ran, seeing no waiter) but not committed when the waiter registers.
    The registration waits for it on the row lock, then reads the finished job;
    without that lock the waiter would see the job still active and never hear
    of its finish (only a poll would)."""
    await _listening(client)
    parked = await client.insert(Work(0), queue="parked")
    sentinel = asyncio.create_task(parked.wait(timeout=NO_POLL, poll_interval=NO_POLL))
    await _only_notify_can_wake(client)
    job = await client.insert(Work(1), queue="held")
    finisher = await asyncpg.connect(database_url)
    try:
        await finisher.execute(TO_MUTABLE, job.id)  # FINISH deletes from awa.jobs
        tx = finisher.transaction()
        await tx.start()
        await finisher.execute(FINISH, job.id)
        waiting = asyncio.create_task(job.wait(timeout=NO_POLL, poll_interval=NO_POLL))
        pool = await client.pool()

        async def blocked_or_registered() -> bool:
            return bool(await pool.fetchval(
                "SELECT (SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()) + (SELECT count(*) FROM awa.job_waiters)"
                " > 1"))  # the sentinel's registration is one
        await wait_until(blocked_or_registered, message="the waiter's registration")
        await tx.commit()
        done = await asyncio.wait_for(waiting, PROMPT)
        assert done.state is awa.JobState.Completed
    finally:
        await finisher.close()
        sentinel.cancel()


async def test_only_the_finish_of_a_waited_on_job_runs_a_trigger_function(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """Jobs nobody waits on do not pay for awaitable results (issue 33): their
    finish calls no plpgsql function at all (0018: the finished row's trigger
    is filtered in C); the finish of a registered job does, and that notifies
    and unregisters."""
    plain = await client.insert(Work(1), queue="held")
    waited = await client.insert(Work(2), queue="held")
    for job in (plain, waited):
        await conn.execute(TO_MUTABLE, job.id)  # FINISH deletes from awa.jobs
    assert await conn.fetchval(queries()["result_register"], waited.id, None) == waited.id
    await conn.execute("LISTEN awa_result")
    heard: list[str] = []
    await conn.add_listener("awa_result", lambda *args: heard.append(args[3]))
    calls = []
    for job in (plain, waited):
        async with conn.transaction():
            await conn.execute("SET LOCAL track_functions = 'pl'")
            await conn.execute(FINISH, job.id)
            calls.append(await conn.fetchval(
                "SELECT coalesce(sum(pg_stat_get_xact_function_calls(oid)), 0) FROM pg_proc"
                " WHERE pronamespace = 'awa'::regnamespace"))
    assert calls[0] == 0 and calls[1] > 0
    await wait_until(lambda: _value(heard == [str(waited.id)]), message="the NOTIFY")
    assert await conn.fetchval("SELECT count(*) FROM awa.job_waiters") == 0


async def test_a_registration_in_flight_during_a_finish_is_not_missed(
        client: awa.AsyncClient, database_url: str) -> None:
    """The other order of the race: the registration has marked the row but not
    committed when the job finishes. The finish waits for it on the row lock,
    then deletes the marked row, and its trigger finds the waiter."""
    job = await client.insert(Work(1), queue="held")
    registrar = await asyncpg.connect(database_url)
    finisher = await asyncpg.connect(database_url)
    try:
        await registrar.execute(TO_MUTABLE, job.id)  # registering marks awa.jobs's row
        await finisher.execute("LISTEN awa_result")
        heard: list[str] = []
        await finisher.add_listener("awa_result", lambda *args: heard.append(args[3]))
        tx = registrar.transaction()
        await tx.start()
        assert await registrar.fetchval(queries()["result_register"], job.id, None) == job.id
        finishing = asyncio.create_task(finisher.execute(FINISH, job.id))
        pool = await client.pool()
        await wait_until(lambda: pool.fetchval(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"), message="the finish waiting on the lock")
        await tx.commit()
        assert await asyncio.wait_for(finishing, PROMPT) == "INSERT 0 1"
        await wait_until(lambda: _value(heard == [str(job.id)]), message="the NOTIFY")
        assert await pool.fetchval("SELECT count(*) FROM awa.job_waiters") == 0
    finally:
        await registrar.close()
        await finisher.close()


async def test_an_inserted_job_is_still_a_plain_job(client: awa.AsyncClient) -> None:
    import dataclasses
    import pickle

    job = await client.insert(Work(1), queue="r")
    plain = await client.get_job(job.id)
    assert type(plain) is awa.Job and plain == job
    assert dataclasses.asdict(job) == dataclasses.asdict(plain)
    assert job.to_dict() == plain.to_dict()
    copied = pickle.loads(pickle.dumps(job))  # a plain Job: the waiter stays behind
    assert type(copied) is awa.Job and copied == plain
    with pytest.raises(awa.AwaError, match=r"client\.wait_for"):
        await dataclasses.replace(job, priority=1).wait(timeout=0)  # no waiter attached


async def test_cleanup_prunes_registrations_of_dead_waiters(client: awa.AsyncClient) -> None:
    """A waiter that died before its deadline leaves its registration; the
    cleanup service drops it once expired (a live one with time left stays)."""
    dead = await client.insert(Work(1), queue="nobody")
    alive = await client.insert(Work(2), queue="nobody")
    pool = await client.pool()
    await pool.execute("INSERT INTO awa.job_waiters VALUES ($1, now() - interval '1 hour'), "
                       "($2, now() + interval '1 hour')", dead.id, alive.id)
    from tests.helpers import idle_task

    idle_task(client)
    await client.start([("idle", 1)], **FAST)
    runtime = client.runtime
    assert runtime is not None
    await runtime.service("cleanup").run_once()
    assert [r["job_id"] for r in await pool.fetch("SELECT job_id FROM awa.job_waiters")] \
        == [alive.id]


async def test_wait_for_sync_from_a_thread(client: awa.AsyncClient,
                                           sync_client: awa.Client) -> None:
    job = await client.insert(Work(6), queue="r")
    with pytest.raises(awa.AwaError, match="own event loop"):
        client.wait_for_sync(job.id, timeout=1)  # on the loop's thread: refused, not deadlocked
    with pytest.raises(awa.WaitTimeout):
        await asyncio.to_thread(client.wait_for_sync, job.id, 0.1)
    _worker(client)
    await client.start([("r", 2)], **FAST)
    done = await asyncio.to_thread(client.wait_for_sync, job.id, PROMPT)
    assert done.state is awa.JobState.Completed and done.output == {"double": 12}
    assert (await asyncio.to_thread(sync_client.wait_for_sync, job.id, 1)).id == job.id


def test_wait_for_sync_needs_an_open_client() -> None:
    with pytest.raises(awa.AwaError, match="running event loop"):
        awa.AsyncClient("postgresql://nobody@127.0.0.1:1/none").wait_for_sync(1, timeout=1)


async def test_a_cancelled_waiter_keeps_the_registration_others_need(
        client: awa.AsyncClient) -> None:
    """The registration holds the latest deadline of the job's waiters; a waiter
    cancelled with that deadline deleted it, and the others then heard no
    NOTIFY (issue 40)."""
    await _listening(client)
    job = await client.insert(Work(5), queue="held")
    pool = await client.pool()
    staying = asyncio.create_task(client.wait_for(job.id, timeout=NO_POLL,
                                                  poll_interval=NO_POLL))
    await wait_until(lambda: pool.fetchval("SELECT count(*) FROM awa.job_waiters"),
                     message="the first registration")
    leaving = asyncio.create_task(client.wait_for(job.id, poll_interval=NO_POLL))  # no deadline
    await wait_until(lambda: pool.fetchval(
        "SELECT expires_at = 'infinity' FROM awa.job_waiters"), message="the second one")
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert await pool.fetchval("SELECT count(*) FROM awa.job_waiters") == 1
    await _only_notify_can_wake(client)
    await client.cancel(job.id)
    done = await asyncio.wait_for(staying, PROMPT)
    assert done.state is awa.JobState.Cancelled
    assert await pool.fetchval("SELECT count(*) FROM awa.job_waiters") == 0


async def test_cleanup_prunes_registrations_of_deleted_jobs(client: awa.AsyncClient) -> None:
    job = await client.insert(Work(1), queue="nobody")
    pool = await client.pool()
    await pool.execute(TO_MUTABLE, job.id)  # registering marks awa.jobs's row
    assert await pool.fetchval(queries()["result_register"], job.id, None) == job.id
    await pool.execute("DELETE FROM awa.jobs WHERE id = $1", job.id)
    await pool.execute(queries()["result_waiters_prune"])
    assert await pool.fetchval("SELECT count(*) FROM awa.job_waiters") == 0
