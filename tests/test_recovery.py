"""Crash recovery: rescue, stale writes, deadlines, leader fail-over, shutdown, scale."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from tests.helpers import (
    FAST,
    TO_MUTABLE,
    hold_partitions,
    idle_task,
    spawn_worker,
    wait_for_state,
    wait_until,
)

import awa
from awa.core.model import Outcome
from awa.db.queries import queries
from awa.telemetry.signals import Signals
from awa.worker.capacity import Capacity
from awa.worker.completion import Completer
from awa.worker.config import QueueConfig
from awa.worker.dispatcher import Dispatcher


@dataclass
class Sleepy:
    seconds: float
    marker: str = ""


async def _state(client: awa.AsyncClient, job_id: int) -> awa.JobState:
    return (await client.get_job(job_id)).state


async def test_sigkilled_worker_jobs_are_rescued_elsewhere(client: awa.AsyncClient,
                                                           database_url: str,
                                                           conn: asyncpg.Connection) -> None:
    job = await client.insert(Sleepy(30.0), queue="procs")
    proc = spawn_worker(database_url)
    try:
        async def running() -> bool:
            return await _state(client, job.id) is awa.JobState.Running
        await wait_until(running, timeout=30, message="the subprocess to claim the job")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # A second worker (this process) rescues the job and completes it.
    await conn.execute("UPDATE awa.jobs SET args = '{\"seconds\": 0}' WHERE id = $1", job.id)

    @client.task(Sleepy, queue="procs")
    async def handle(j: awa.Job) -> None:
        return None

    await client.start([("procs", 2)], **FAST)

    async def completed() -> awa.Job | None:
        j = await client.get_job(job.id)
        return j if j.state is awa.JobState.Completed else None
    done = await wait_until(completed, timeout=20, message="rescue and completion")
    assert done.attempt == 2 and done.run_lease == 2
    assert done.errors[0]["error"] == "heartbeat stale"


async def test_stale_completion_after_rescue_changes_nothing(client: awa.AsyncClient,
                                                             conn: asyncpg.Connection) -> None:
    job = await client.insert(Sleepy(0))
    await conn.execute(TO_MUTABLE, job.id)  # the mutable lane's guard (the ring's: test_ring_*)
    pool = await client.pool()
    q = queries()
    claimed = await pool.fetch(q["attempt_claim"], "default", 1, 0.0, 60.0)
    lease = claimed[0]["run_lease"]
    # The attempt goes stale and is rescued; a new attempt claims it.
    await conn.execute("UPDATE awa.jobs SET heartbeat_at = now() - interval '1 hour' "
                       "WHERE id = $1", job.id)
    rescued = await pool.fetch(q["job_rescue_running"], timedelta(seconds=90), 100,
                               timedelta(days=1), None, [])
    assert [r["id"] for r in rescued] == [job.id]
    await conn.execute("UPDATE awa.jobs SET state = 'available' WHERE id = $1", job.id)
    second = await pool.fetch(q["attempt_claim"], "default", 1, 0.0, 60.0)
    assert second[0]["run_lease"] == lease + 1
    completer = Completer(pool, q, completed_retention=timedelta(days=1),
                          failed_retention=timedelta(days=1))
    completer.start()
    try:
        # Every kind of late write from the first attempt is dropped.
        assert not await completer.write(job.id, lease, Outcome("fail", error="late"))
        assert not await completer.write(job.id, lease, Outcome("retry", delay=1))
        assert not await completer.write(job.id, lease, Outcome("snooze", delay=1))
        assert not await completer.write(job.id, lease, Outcome("cancel", error="late"))
        completer.complete(job.id, lease)
        await completer.drain()
        assert completer.stale == 1 and completer.completed == 0
        current = await client.get_job(job.id)
        assert current.state is awa.JobState.Running and current.run_lease == lease + 1
        completer.complete(job.id, lease + 1)
        await completer.drain()
        assert (await client.get_job(job.id)).state is awa.JobState.Completed
    finally:
        await completer.stop()


async def test_deadline_rescue_flags_the_live_handler(client: awa.AsyncClient) -> None:
    saw_cancel = asyncio.Event()

    @client.task(Sleepy, queue="slow")
    async def handle(job: awa.Job) -> None:
        while not job.is_cancelled():
            await asyncio.sleep(0.01)
        saw_cancel.set()

    job = await client.insert(Sleepy(0), queue="slow", max_attempts=1)
    await client.start([{"name": "slow", "max_workers": 1, "deadline_duration_ms": 300}], **FAST)
    await asyncio.wait_for(saw_cancel.wait(), timeout=15)

    async def failed() -> awa.Job | None:
        j = await client.get_job(job.id)
        return j if j.state is awa.JobState.Failed else None
    done = await wait_until(failed)
    assert done.errors[-1]["error"].startswith("hard deadline exceeded: the attempt ran longer")
    assert "deadline_duration_ms" in done.errors[-1]["error"]
    assert done.errors[-1]["terminal"] is True


async def test_leader_fail_over(database_url: str) -> None:
    a = awa.AsyncClient(database_url)
    b = awa.AsyncClient(database_url)
    idle_task(a, "x")
    idle_task(b, "x")
    try:
        await a.start([("x", 1)], **FAST)
        assert a.runtime is not None
        await wait_until(lambda: _is_leader(a), message="first leader")
        await b.start([("x", 1)], **FAST)
        assert b.runtime is not None
        assert not b.runtime.leader.is_leader
        # Stop a without resigning (as a crash would): b takes over once the lease expires.
        a_runtime = a.runtime
        a_runtime.leader.resign = _no_resign  # type: ignore[method-assign]
        await a.shutdown(timeout_ms=0)
        await wait_until(lambda: _is_leader(b), timeout=5, message="fail-over")
    finally:
        await a.close()
        await b.close()


async def _no_resign() -> None:
    return None


async def _is_leader(c: awa.AsyncClient) -> bool:
    return c.runtime is not None and c.runtime.leader.is_leader


async def test_graceful_shutdown(client: awa.AsyncClient, signals: Signals) -> None:
    release = asyncio.Event()
    started: list[float] = []

    @client.task(Sleepy)
    async def handle(job: awa.Job) -> None:
        started.append(job.args.seconds)
        if job.args.seconds > 5:
            await asyncio.sleep(job.args.seconds)  # outlives the shutdown timeout
        else:
            await release.wait()

    quick = await client.insert(Sleepy(0.1))
    slow = await client.insert(Sleepy(60))
    await client.start([("default", 2)], **FAST)
    await wait_until(lambda: _true_if(len(started) == 2), message="both handlers to start")
    late = await client.insert(Sleepy(0.1))
    shutdown = asyncio.create_task(client.shutdown(timeout_ms=1500))
    await signals.wait("stopped", queue="default")  # the claim loop is over
    release.set()  # the quick handler finishes during shutdown
    await shutdown
    assert (await client.get_job(quick.id)).state is awa.JobState.Completed
    assert (await client.get_job(slow.id)).state is awa.JobState.Running  # left for rescue
    assert (await client.get_job(late.id)).state is awa.JobState.Available  # never claimed


async def _true_if(value: bool) -> bool:
    return value


async def test_many_workers_complete_each_job_once(database_url: str,
                                                   conn: asyncpg.Connection) -> None:
    n_jobs, n_workers = 3000, 3
    runs: dict[int, int] = {}
    clients = [awa.AsyncClient(database_url, max_connections=4) for _ in range(n_workers)]
    for c in clients:
        @c.task(Sleepy, queue="many")
        async def handle(job: awa.Job) -> None:
            runs[job.id] = runs.get(job.id, 0) + 1
    try:
        await clients[0].enqueue_many_copy([Sleepy(0) for _ in range(n_jobs)], queue="many")
        for c in clients:
            await c.start([("many", 16)], **FAST)

        async def all_done() -> bool:
            n = await conn.fetchval("SELECT count(*) FROM awa.jobs_done WHERE state = 'completed'")
            return bool(n == n_jobs)
        await wait_until(all_done, timeout=120, message="all jobs completed")
    finally:
        for c in clients:
            await c.close()
    assert len(runs) == n_jobs and set(runs.values()) == {1}
    dupes = await conn.fetchval("SELECT count(*) - count(DISTINCT id) FROM awa.jobs_done")
    assert dupes == 0
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 0
    per_worker = [c.runtime for c in clients]
    assert per_worker == [None, None, None]  # closed cleanly


async def test_awa_worker_sigterm_finishes_in_flight_job(client: awa.AsyncClient,
                                                         database_url: str) -> None:
    job = await client.insert(Sleepy(1.0), queue="procs")
    proc = spawn_worker(database_url)
    try:
        async def running() -> bool:
            return await _state(client, job.id) is awa.JobState.Running
        await wait_until(running, timeout=30, message="the worker to claim the job")
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0
    assert await _state(client, job.id) is awa.JobState.Completed


async def test_polling_alone_without_listen(client: awa.AsyncClient) -> None:
    @client.task(Sleepy)
    async def handle(job: awa.Job) -> None:
        return None

    await client.start([("default", 2)], listen=False, **FAST)
    assert client.runtime is not None and not client.runtime.listening
    job = await client.insert(Sleepy(0))

    async def completed() -> bool:
        return await _state(client, job.id) is awa.JobState.Completed
    await wait_until(completed, message="a polled claim")
    assert not (await client.health_check()).listen_enabled


async def test_leader_vacuums_a_churned_jobs_table(client: awa.AsyncClient,
                                                   conn: asyncpg.Connection) -> None:
    # The case this covers: autovacuum off or behind. Left on (as on the embedded
    # server), it can clean the table first and leave the leader nothing to do.
    await conn.execute("ALTER TABLE awa.jobs SET (autovacuum_enabled = false)")
    # Scheduled: they wait in awa.jobs whichever lane takes plain jobs.
    later = datetime.now(UTC) + timedelta(hours=1)
    await client.enqueue_many_copy([Sleepy(0) for _ in range(12_000)], queue="churn",
                                   run_at=later)
    await conn.execute("DELETE FROM awa.jobs WHERE queue = 'churn'")
    await conn.execute("SELECT pg_stat_force_next_flush()")  # PostgreSQL 15+
    assert int(await conn.fetchval("SELECT n_dead_tup FROM pg_stat_user_tables "
                                   "WHERE relid = 'awa.jobs'::regclass")) >= 10_000
    idle_task(client, "other")
    await client.start([("other", 1)], **FAST)
    assert client.runtime is not None
    vacuumer = client.runtime.service("vacuum")

    async def dead() -> int:
        return int(await conn.fetchval("SELECT n_dead_tup FROM pg_stat_user_tables "
                                       "WHERE relid = 'awa.jobs'::regclass"))

    async def vacuumed() -> bool:  # by the leader on its own, within its check interval
        return vacuumer.vacuums >= 1 and await dead() < 10_000  # type: ignore[attr-defined]
    await wait_until(vacuumed, timeout=30, message="the leader's vacuum")


async def test_cleanup_creates_only_the_partitions_finished_jobs_land_in(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """Each pass makes the hourly jobs_done partitions of now + each retention (for
    the next two passes), one transaction each, and not every hour in between:
    the first pass used to create 73 at once and stalled completions for 8 s."""
    @client.task(Sleepy)
    async def handle(job: awa.JobContext) -> None:
        await asyncio.sleep(job.args.seconds)

    idle_task(client, "other")
    await client.start([("other", 1)], **FAST)
    assert client.runtime is not None
    await client.runtime.service("cleanup").run_once()
    names = {r["relname"] for r in await conn.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'awa.jobs_done'::regclass AND c.relname LIKE 'jobs_done_p%'")}
    now = await conn.fetchval("SELECT now()")

    def part(at: datetime) -> str:
        return f"jobs_done_p{at.astimezone(UTC):%Y%m%d%H}"
    assert part(now + timedelta(hours=24)) in names  # completed retention
    assert part(now + timedelta(hours=72)) in names  # failed retention
    assert part(now + timedelta(hours=12)) not in names  # no hour lands there
    assert len(names) <= 6

    async def finished() -> bool:
        return await _state(client, job.id) is awa.JobState.Completed
    job = await client.insert(Sleepy(0), queue="other")
    await wait_until(finished)
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_done_default") == 0


async def test_a_new_workers_first_completions_land_in_their_hours_partition(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """Every worker makes the partitions finished jobs land in before it claims,
    leader or not: completions that came before the leader's first cleanup pass
    went to the default partition, which kept that hour's partition from ever
    being made (the soak's fresh database filled it for an hour)."""
    @client.task(Sleepy)
    async def handle(job: awa.JobContext) -> None:
        await asyncio.sleep(job.args.seconds)

    job = await client.insert(Sleepy(0), queue="other")
    # No periodic cleanup pass within the test: only the start-up one counts.
    idle_task(client, "other")
    await client.start([("other", 1)], **{**FAST, "cleanup_interval_ms": 3_600_000})

    async def finished() -> bool:
        return await _state(client, job.id) is awa.JobState.Completed
    await wait_until(finished)
    part, prune_after = await conn.fetchrow(
        "SELECT c.relname, d.prune_after FROM awa.jobs_done d "
        "JOIN pg_class c ON c.oid = d.tableoid WHERE d.id = $1", job.id)
    assert part == f"jobs_done_p{prune_after.astimezone(UTC):%Y%m%d%H}"
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_done_default") == 0


async def test_a_cleanup_pass_with_no_partition_to_make_is_one_read(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """A pass (and every worker's start) first reads which hours lack a partition
    and opens a transaction only for those: it used to open one per hour of each
    retention's window, partition or not (a dozen round trips at each start)."""
    idle_task(client, "other")
    await client.start([("other", 1)], **FAST)
    assert client.runtime is not None
    cleaner = client.runtime.service("cleanup")
    pool = await client.pool()

    class Counted:  # the connection, counting what the pass asks of it
        def __init__(self, c: asyncpg.Connection) -> None:
            self.c, self.calls = c, []

        def __getattr__(self, name: str) -> Any:
            self.calls.append(name)
            return getattr(self.c, name)

    async with pool.acquire() as c:
        counted = Counted(c)
        await cleaner._ensure_partitions(counted)  # type: ignore[attr-defined]
        assert counted.calls == ["fetch"]
        # One partition of the window dropped: the next pass makes exactly it.
        now = await conn.fetchval("SELECT now()")
        gone = f"jobs_done_p{(now + timedelta(hours=24)).astimezone(UTC):%Y%m%d%H}"
        await conn.execute(f'DROP TABLE awa."{gone}"')
        counted = Counted(c)
        await cleaner._ensure_partitions(counted)  # type: ignore[attr-defined]
        assert counted.calls.count("transaction") == 1
    assert await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"awa.{gone}")


async def test_jobs_start_after_the_partitions_and_before_presence(
        client: awa.AsyncClient, conn: asyncpg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker claims at once, but runs no job (so writes no outcome) before the
    partitions its outcomes land in exist; it runs them without waiting for the
    rest of its start (presence on the runtime page), which start() still waits
    for. A new session's first claim plans awa.claim's statements and a fresh
    database's first start makes partitions: the two no longer follow each other."""
    from awa.worker.presence import Presence
    partitions, presence = hold_partitions(monkeypatch), asyncio.Event()
    real_presence = Presence.prepare

    async def slow_presence(self: Presence) -> None:
        await presence.wait()
        await real_presence(self)
    monkeypatch.setattr(Presence, "prepare", slow_presence)
    ran = asyncio.Event()

    @client.task(Sleepy, queue="early")
    async def handle(job: awa.JobContext) -> None:
        ran.set()

    job = await client.insert(Sleepy(0), queue="early")
    start = asyncio.create_task(client.start([("early", 1)], **FAST))
    try:
        await wait_for_state(client, job.id, awa.JobState.Running, timeout=10)  # the claim
        await asyncio.sleep(0.3)
        assert not ran.is_set()  # claimed, but not run before the partitions
        assert await conn.fetchval("SELECT count(*) FROM awa.jobs_done") == 0
        partitions.set()
        await asyncio.wait_for(ran.wait(), timeout=10)
        assert not start.done()  # start() still waits for presence

        async def completed() -> bool:
            return await _state(client, job.id) is awa.JobState.Completed
        await wait_until(completed, timeout=10, message="the completion")
        beats = "SELECT count(*) FROM awa.presence_beats WHERE NOT gone"
        assert await conn.fetchval(beats) == 0
        presence.set()
        await asyncio.wait_for(start, timeout=10)
        assert await conn.fetchval(beats) >= 1  # on the runtime page once start() returns
    finally:
        partitions.set()
        presence.set()
        await asyncio.gather(start, return_exceptions=True)


async def test_jobs_claimed_before_the_partitions_keep_to_the_shared_slots(
        client: awa.AsyncClient, conn: asyncpg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Queues sharing slots (weighted) claim no more while their jobs wait for the
    partitions than the slots they share: each held job keeps its slot taken, and
    starts in it. Without that, each queue counted the same free slots."""
    partitions = hold_partitions(monkeypatch)
    for q in ("a", "b"):
        @client.task(Sleepy, kind=f"held_{q}", queue=q)
        async def handle(job: awa.JobContext) -> None:
            return None
    ids = [(await client.insert(Sleepy(0), kind=f"held_{q}", queue=q)).id
           for q in ("a", "b") for _ in range(10)]
    start = asyncio.create_task(client.start(
        [{"name": "a", "min_workers": 1, "weight": 1},
         {"name": "b", "min_workers": 1, "weight": 1}], global_max_workers=4, **FAST))
    running = "SELECT count(*) FROM awa.jobs_all WHERE state = 'running'"
    try:
        await wait_until(lambda: conn.fetchval(running), message="the first claims")
        await asyncio.sleep(0.5)  # several claim rounds (FAST polls)
        assert await conn.fetchval(running) <= 4
        assert await conn.fetchval("SELECT count(*) FROM awa.jobs_done") == 0
        partitions.set()
        await asyncio.wait_for(start, timeout=10)
        for job_id in ids:
            await wait_for_state(client, job_id, awa.JobState.Completed)
    finally:
        partitions.set()
        await asyncio.gather(start, return_exceptions=True)


async def test_jobs_claimed_keep_the_slots_reserved_for_them(
        client: awa.AsyncClient) -> None:
    """A claim reserves its slots before the round trip; the jobs it brings back run
    in them even if the shared slots were split anew meanwhile (another queue became
    hungry). Released and counted again, a job claimed for a slot waited without
    one, and the other queue claimed that slot as well: 5 claimed for 4 slots."""
    weighted = [QueueConfig(name=q, min_workers=1, weight=1) for q in ("wa", "wb")]
    capacity = Capacity(weighted, 4)  # one slot each, two shared
    pool = await client.pool()

    class Hungry:
        """The pool, but queue wb turns hungry while wa's claim is under way."""
        async def fetch(self, *args: Any) -> list[asyncpg.Record]:
            capacity.set_hungry("wb", True)
            return await pool.fetch(*args)

    started: list[int] = []
    d = Dispatcher(weighted[0], Hungry(), queries(), capacity,
                   lambda j: started.append(j.id), 0.05)
    for _ in range(5):
        await client.insert(Sleepy(0), queue="wa")
    stopping = asyncio.Event()
    loop = asyncio.create_task(d.run(stopping))
    try:
        async def claimed() -> bool:
            return d.claimed >= 3
        await wait_until(claimed, timeout=10, message="wa's claim")
        # Its own slot and both shared ones, reserved while wb was not hungry;
        # wb has its own slot left, and no more: four in all.
        assert len(started) == 3 and not d.ready
        assert capacity.in_use("wa") == 3 and capacity.free("wb") == 1
    finally:
        stopping.set()
        d.wake()
        await loop


async def test_a_claim_whose_rows_cannot_be_taken_gives_its_slots_back(
        client: awa.AsyncClient) -> None:
    """A failure taking the claimed rows that ends the loop (past the per-row
    handling: a broken schema) releases the slots reserved for the claim."""
    d, capacity = await _dispatcher(client, "lost", lambda j: None)
    await client.insert(Sleepy(0), queue="lost")

    def broken(rows: list[asyncpg.Record], keyed: bool = False) -> None:
        raise RuntimeError("rows cannot be taken")
    d._take_rows = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="cannot be taken"):
        await asyncio.wait_for(d.run(asyncio.Event()), timeout=10)
    assert capacity.in_use("lost") == 0


async def _dispatcher(client: awa.AsyncClient, queue: str, launch: Callable[[awa.Job], None],
                      **cfg: Any) -> tuple[Dispatcher, Capacity]:
    """A dispatcher of ``queue`` with four slots of its own, claiming through
    ``client``'s pool and handing each job it starts to ``launch``."""
    config = QueueConfig(name=queue, max_workers=4, **cfg)
    capacity = Capacity([config], None)
    return Dispatcher(config, await client.pool(), queries(), capacity, launch, 0.05), capacity


async def test_jobs_held_for_the_partitions_give_their_slots_back(
        client: awa.AsyncClient) -> None:
    """A job held with its slot (see above) frees it when it is forgotten (cancelled
    meanwhile) or handed back at shutdown; the others start in theirs."""
    started: list[int] = []
    d, capacity = await _dispatcher(client, "held", lambda j: started.append(j.id))
    jobs = [await client.insert(Sleepy(0), queue="held") for _ in range(6)]
    d.hold_starts()
    d.ready.extend(jobs)
    d._start_ready()
    assert capacity.in_use("held") == 4 and not started  # four slots taken, none started
    assert d.forget(jobs[0].id)  # held in a slot: the slot frees, the next job takes it
    assert capacity.in_use("held") == 3
    d._start_ready()
    assert capacity.in_use("held") == 4
    assert d.forget(jobs[5].id)  # not in a slot: nothing to free
    assert capacity.in_use("held") == 4
    d.allow_starts()
    assert started == [j.id for j in jobs[1:5]] and capacity.in_use("held") == 4
    for _ in started:
        capacity.release("held")
    d.hold_starts()
    d.ready.extend(jobs[:2])
    d._start_ready()
    assert capacity.in_use("held") == 2
    await d._unclaim()  # the worker stops before they start
    assert capacity.in_use("held") == 0 and not d.ready


async def test_claims_while_held_count_each_held_job_once(
        client: awa.AsyncClient) -> None:
    """While starts are held, a claim asks for the slots left: a held job is out of
    the free slots already, and must not be taken off the claim a second time."""
    d, capacity = await _dispatcher(client, "count", lambda j: None, claim_batch_size=1)
    ids = [(await client.insert(Sleepy(0), queue="count")).id for _ in range(6)]
    d.hold_starts()
    stopping = asyncio.Event()
    loop = asyncio.create_task(d.run(stopping))
    try:
        # Claims of one (the batch size) until the four slots are held: counted
        # twice, two held jobs would have left no claim for the other two slots.
        async def four_held() -> bool:
            return len(d.ready) == 4
        await wait_until(four_held, timeout=10, message="four held jobs")
        await asyncio.sleep(0.3)
        assert len(d.ready) == 4 and capacity.in_use("count") == 4
    finally:
        stopping.set()
        d.wake()
        await loop
    assert capacity.in_use("count") == 0 and not d.ready  # handed back at the stop
    states = {(await client.get_job(i)).state for i in ids}
    assert states == {awa.JobState.Available}


async def test_a_start_cancelled_before_the_partitions_shuts_down_and_hands_back(
        client: awa.AsyncClient, conn: asyncpg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """start() cancelled while its partitions are being made (they never are, here):
    shutdown() does not wait for them, writes no outcome, and hands the jobs claimed
    meanwhile back to the queue."""
    hold_partitions(monkeypatch)  # for ever
    ran = asyncio.Event()

    @client.task(Sleepy, queue="cut")
    async def handle(job: awa.JobContext) -> None:
        ran.set()

    job = await client.insert(Sleepy(0), queue="cut")
    start = asyncio.create_task(client.start([("cut", 2)], **FAST))

    await wait_for_state(client, job.id, awa.JobState.Running, timeout=10)  # the claim
    runtime = client.runtime
    assert runtime is not None
    start.cancel()
    await asyncio.gather(start, return_exceptions=True)
    await asyncio.wait_for(client.shutdown(), timeout=20)
    assert not ran.is_set()
    assert await _state(client, job.id) is awa.JobState.Available
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs_done") == 0
    # No pass of a service that may write outcomes ran without the partitions.
    passes = {svc.name: svc.runs for svc in runtime.services if svc.waits_for_partitions}
    assert passes and not any(passes.values()), passes


async def test_cleanup_drops_expired_partitions_one_at_a_time_and_never_queues(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str) -> None:
    """Expired jobs_done partitions are dropped one per transaction, each read
    (unique claims released, rows counted) before its drop locks awa.jobs_done:
    dropping several in one transaction held that lock, which every completion
    needs, while the next partition was scanned (a 1.2 s stall in the soak). A
    partition in use is left for the next pass instead of queueing completions
    behind the drop's lock request."""
    rows = {"2020010100": 100, "2020010101": 50}
    for hour, n in rows.items():
        start = datetime.strptime(hour, "%Y%m%d%H").replace(tzinfo=UTC)
        # DDL takes no parameters; the bounds are fixed literals of this test.
        await conn.execute(f"CREATE TABLE awa.jobs_done_p{hour} PARTITION OF awa.jobs_done "
                           f"FOR VALUES FROM ('{start}') TO ('{start + timedelta(hours=1)}')")
        await conn.execute(
            "INSERT INTO awa.jobs_done (id, kind, queue, args, state, priority, attempt, "
            "max_attempts, run_lease, run_at, created_at, finalized_at, tags, metadata, "
            "unique_key, prune_after) SELECT 1000000 + $3 * 1000 + g, 'old', 'default', '{}', "
            "'completed', 2, 1, 25, 1, $1::timestamptz, $1, $1, '{}', '{}', "
            "CASE WHEN g = 1 THEN decode($4, 'hex') END, $1::timestamptz + interval '1 minute' "
            "FROM generate_series(1, $2) g", start, n, int(hour[-1]), f"0{hour[-1]}ff")
        await conn.execute("INSERT INTO awa.unique_claims (unique_key, job_id) "
                           "VALUES (decode($1, 'hex'), $2) ON CONFLICT DO NOTHING",
                           f"0{hour[-1]}ff", 1000000 + int(hour[-1]) * 1000 + 1)

    async def partitions() -> set[str]:
        return {r["relname"] for r in await conn.fetch(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'awa.jobs_done'::regclass AND c.relname LIKE 'jobs_done_p2020%'")}

    idle_task(client, "default")
    await client.start([("default", 1)], **FAST)
    assert client.runtime is not None
    cleanup = client.runtime.service("cleanup")
    before = cleanup.pruned  # type: ignore[attr-defined]
    reader = await asyncpg.connect(database_url)
    try:
        async with reader.transaction():  # a long read of the newer partition
            await reader.fetchval("SELECT count(*) FROM awa.jobs_done_p2020010101")
            await asyncio.wait_for(cleanup.run_once(), timeout=10)
            # The older one went in its own transaction; the one in use waits.
            assert await partitions() == {"jobs_done_p2020010101"}
            assert cleanup.pruned - before == 100  # type: ignore[attr-defined]
        await cleanup.run_once()
    finally:
        await reader.close()
    assert await partitions() == set()
    assert cleanup.pruned - before == 150  # type: ignore[attr-defined]
    assert await conn.fetchval("SELECT count(*) FROM awa.unique_claims") == 0


async def test_held_connection_survives_a_backend_killed_while_idle(database_url: str) -> None:
    """The claim loop's and the completion writer's held connection: when the server
    ends it between statements (a restart, pg_terminate_backend), the next statement
    runs on a fresh connection instead of failing once with "released back to the pool"."""
    from awa.db.pool import HeldConnection

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    killer = await asyncpg.connect(database_url)
    try:
        held = HeldConnection(pool)
        pid = (await held.fetch("SELECT pg_backend_pid() AS pid"))[0]["pid"]
        await killer.execute("SELECT pg_terminate_backend($1)", pid)

        async def released() -> bool:
            return "released" in repr(held._conn)
        await wait_until(released, message="asyncpg to notice the killed backend")
        rows = await held.fetch("SELECT pg_backend_pid() AS pid")
        assert rows[0]["pid"] != pid
        assert await held.execute("SELECT 1") == "SELECT 1"
        await held.release()
    finally:
        await killer.close()
        await pool.close()
