"""The job state machine under random operation sequences (see `tests.prop_state_model`).

A hypothesis `RuleBasedStateMachine` drives a real database through inserts
(every enqueue path, unique options), claims (harness and runtime statements),
handler outcomes (with staged follow-ups and early callbacks), admin actions,
callback resolutions (valid, stale and unknown ids), crash rescue, callback
timeouts, promotion, the DLQ and stale or replayed completions. It keeps a
model of every job and checks after each step that the database matches it
and that the storage invariants hold (`tests.prop_support.check_invariants`).
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import asyncpg
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from tests.helpers import TO_MUTABLE
from tests.prop_state_model import (
    DLQ_QUEUE,
    FQ,
    MASKS,
    QUEUES,
    Behavior,
    Exhausted,
    FollowUp,
    Grouped,
    Model,
    Plain,
    Task,
    handler_for,
)
from tests.prop_support import LoopThread, check_invariants, connect, prop_settings
from tests.prop_support import reset as reset_db
from tests.prop_support import rows as all_rows

import awa
from awa.core.model import Job, Outcome
from awa.maintenance.services import Promoter, Rescuer
from awa.testing import AwaTestClient, JobRow
from awa.worker.completion import Completer
from awa.worker.context import AttemptDb, JobContext
from awa.worker.executor import JobExecutor
from awa.worker.finalize import Finalizer
from awa.worker.followups import EnqueueRequest
from awa.worker.tasks import Registry, make_spec

HOUR = timedelta(hours=1)
BEHAVIORS = st.builds(
    Behavior, outcome=st.sampled_from(["complete", "complete", "output", "raise", "raise",
                                       "terminal", "retry_after", "snooze", "cancel", "wait",
                                       "wait", "wait", "wait", "wait_unregistered"]),
    stage=st.sampled_from(["none", "plain", "unique", "poison"]),
    early=st.sampled_from(["none", "none", "none", "none", "complete", "resume", "retry",
                           "fail"]),
    batch=st.booleans())
UNIQUE = st.one_of(st.none(), st.just({}), st.builds(
    lambda m, bq: {"states": m, "by_queue": bq}, st.sampled_from(MASKS), st.booleans()))

#: The harness's order (job_ring_next_to_mutable, then attempt_claim_one_kind): the
#: available jobs of queue $1 and kind $2, both lanes, by priority, run_at, id.
HARNESS_ORDER_SQL = (
    "SELECT id FROM awa.jobs_active WHERE state = 'available' AND queue = $1 AND kind = $2"
    " ORDER BY priority, run_at, id")

#: The runtime claim's order (awa.claim, migration 0020; docs/storage.md), aging
#: off: each lane (a priority of awa.jobs, or of the ring) offers its head, FIFO
#: within the lane: awa.jobs's by (run_at, id), the ring's in commit order, which
#: in this test's one-at-a-time transactions is (xid, id). The lanes go by their
#: head's priority, then its run_at, the ring's first on a tie. A job put back
#: into the ring (a retry) goes to the end of its lane, whatever its run_at.
RUNTIME_ORDER_SQL = """
SELECT id FROM (
    (SELECT DISTINCT ON (j.priority) j.id, j.priority, j.run_at, false AS ring
     FROM awa.jobs j
     WHERE j.state = 'available' AND j.queue = $1 AND j.concurrency_key IS NULL
     ORDER BY j.priority, j.run_at, j.id)
    UNION ALL
    (SELECT DISTINCT ON (w.priority) w.id, w.priority, w.run_at, true
     FROM awa.ready w JOIN awa.ring_jobs_available a ON a.id = w.id AND a.run_lease = w.lease_base
     WHERE w.queue = $1
     ORDER BY w.priority, w.xid, w.id)
) heads
ORDER BY priority, run_at, ring DESC
"""


@dataclass
class Attempt:
    """A claimed attempt, held by the test as a worker would hold it."""

    job: Job
    ctx: JobContext | None = None
    finished: bool = False


@dataclass
class Env:
    """What every example shares: the loop thread, client and raw connection."""

    lt: LoopThread
    client: awa.AsyncClient
    conn: asyncpg.Connection
    harness: AwaTestClient
    threads: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(2))


class JobMachine(RuleBasedStateMachine):
    """Random operations against the database, checked against `Model`."""

    env: ClassVar[Env]

    def __init__(self) -> None:
        super().__init__()
        e = self.env
        self.client, self.conn = e.client, e.conn
        self.model = Model()
        self.attempts: list[Attempt] = []
        self.behavior = Behavior()
        self.tokens: list[str] = []
        registry = Registry()
        self.handler = handler_for(self)
        registry.add(make_spec(Task, self.handler, kind=None, queue="q1"))
        registry.add(make_spec(Plain, self.handler, kind=None, queue="q1"))
        self.pool: asyncpg.Pool = self.run(self.client.pool())
        q = self.client._q
        self.executor = JobExecutor(registry, e.threads, AttemptDb(self.pool, q, 0.05))
        self.completer = Completer(self.pool, q,
                                   completed_retention=awa.core.states.COMPLETED_RETENTION,
                                   failed_retention=awa.core.states.FAILED_RETENTION)
        self.finalizer = Finalizer(self.completer, self.client._followups)
        self.rescuer = Rescuer(self.pool, q, timedelta(seconds=1), lambda: True,
                               staleness=timedelta(seconds=90),
                               failed_retention=awa.core.states.FAILED_RETENTION)
        self.promoter = Promoter(self.pool, q, timedelta(seconds=1), lambda: True)
        self.run(self._setup())

    async def _setup(self) -> None:
        await reset_db(self.conn)
        await self.conn.execute(self.client._q["queue_set_dlq"], [DLQ_QUEUE], [True])
        self.completer.start()

    def teardown(self) -> None:
        self.run(self.completer.stop(5))

    def run(self, coro: Any) -> Any:
        return self.env.lt.run(coro)

    async def _rows(self) -> dict[int, dict[str, Any]]:
        return {r["id"]: r for r in await all_rows(self.conn)}

    # -- enqueue ----------------------------------------------------------------------

    @initialize(kind=st.sampled_from(["task", "plain"]), queue=st.sampled_from(QUEUES),
                batch=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1)), min_size=1,
                               max_size=3), unique=UNIQUE, max_attempts=st.integers(1, 3))
    def seed(self, kind: str, queue: str, batch: list[tuple[int, int]],
             unique: dict[str, Any] | None, max_attempts: int) -> None:
        """Start with a few jobs."""
        self.insert(kind, queue, batch, "many", 2, None, unique, max_attempts)

    @rule(kind=st.sampled_from(["task", "plain"]), queue=st.sampled_from(QUEUES),
          batch=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1)), min_size=1,
                         max_size=3),
          path=st.sampled_from(["insert", "many", "copy", "tx", "rollback", "bridge"]),
          priority=st.integers(1, 4), when=st.sampled_from([None, "past", "future"]),
          unique=UNIQUE, max_attempts=st.integers(1, 3))
    def insert(self, kind: str, queue: str, batch: list[tuple[int, int]], path: str,
               priority: int, when: str | None, unique: dict[str, Any] | None,
               max_attempts: int) -> None:
        """Enqueue through one of the insert paths."""
        if path not in ("many", "copy"):
            batch = batch[:1]
        now = datetime.now(UTC)
        run_at = {None: None, "past": now - HOUR, "future": now + HOUR}[when]
        args_type = Task if kind == "task" else Plain
        args = [args_type(n, g) for n, g in batch]
        opts: dict[str, Any] = {"queue": queue, "priority": priority, "run_at": run_at,
                                "unique_opts": unique, "max_attempts": max_attempts}
        plan = self.model.plan_inserts(kind, queue, batch, unique,
                                       "scheduled" if when == "future" else "available",
                                       max_attempts)
        single_conflict = path not in ("many", "copy") and plan[0] is None
        error = self.run(self._insert(path, args, opts))
        if single_conflict:
            assert isinstance(error, awa.UniqueConflict), error
        else:
            assert error is None, error
        new = self.run(self.conn.fetch(  # either lane (plain jobs: the ring)
            "SELECT id FROM awa.jobs_active WHERE id > $1 AND kind = ANY($2::text[]) ORDER BY id",
            self.model.max_id, ["task", "plain"]))
        expected = [] if path == "rollback" else [p for p in plan if p is not None]
        assert len(new) == len(expected), (plan, new)
        event(f"insert: {path} made {len(new)}")
        for row, job in zip(new, expected, strict=True):
            job.id = row["id"]
            self.model.add(job)

    @precondition(lambda self: any(j.key is not None for j in self.model.live()))
    @rule(i=st.integers(0, 50), path=st.sampled_from(["insert", "many", "tx", "bridge"]))
    def duplicate(self, i: int, path: str) -> None:
        """Enqueue a job again with the same unique options and args."""
        j = self.model.pick(i, lambda j: j.key is not None and j.table != "gone")
        assert j is not None
        self.insert(j.kind, j.queue, [(j.n, j.group)], path, 2, None, j.unique_opts,
                    j.max_attempts)

    async def _insert(self, path: str, args: list[Any], opts: dict[str, Any]) -> Exception | None:
        c = self.client
        try:
            if path == "insert":
                await c.insert(args[0], **opts)
            elif path == "many":
                await c.insert_many_copy(args, **opts)
            elif path == "copy":
                await c.enqueue_many_copy(args, **opts)
            elif path == "bridge":
                async with self.pool.acquire() as conn, conn.transaction():
                    await awa.bridge.insert_job(conn, args[0], **opts)
            else:
                async with c.transaction() as tx:
                    await tx.insert(args[0], **opts)
                    if path == "rollback":
                        raise LookupError("roll back")
        except LookupError:
            return None
        except Exception as exc:
            return exc
        return None

    # -- claims and outcomes --------------------------------------------------------

    def _target(self, i: int, kind: str, queue: str) -> tuple[str, str]:
        """Mostly the kind and queue of an available job, so claims find work."""
        job = self.model.pick(i, lambda j: j.table == "jobs" and j.state == "available")
        return (job.kind, job.queue) if job is not None and i % 5 else (kind, queue)

    @rule(i=st.integers(0, 50), kind=st.sampled_from(["task", "plain"]),
          queue=st.sampled_from(QUEUES), runtime=st.booleans())
    def claim(self, i: int, kind: str, queue: str, runtime: bool) -> None:
        """Claim the next job: the harness statement (one kind) or the runtime's (paused-aware)."""
        kind, queue = self._target(i, kind, queue)
        attempt = self.run(self._claim(kind, queue, runtime))
        if attempt is not None:
            event(f"claim: attempt {attempt.job.attempt} of {attempt.job.max_attempts}")
            self.attempts.append(attempt)

    async def _claim(self, kind: str, queue: str, runtime: bool) -> Attempt | None:
        q = self.client._q
        if runtime:
            candidates = await self.conn.fetch(RUNTIME_ORDER_SQL, queue)
            rows = await self.pool.fetch(q["attempt_claim"], queue, 1, 0.0, 0.0)
            row = rows[0] if rows else None
            if queue in self.model.paused:
                candidates = []
        else:
            candidates = await self.conn.fetch(HARNESS_ORDER_SQL, queue, kind)
            # As the harness does (AwaTestClient): the next job of the kind, if it is
            # a ring job, moves to awa.jobs, where its claim statement looks.
            await self.pool.fetchval(q["job_ring_next_to_mutable"], queue, kind)
            row = await self.pool.fetchrow(q["attempt_claim_one_kind"], queue, kind)
        if not candidates:
            assert row is None
            return None
        assert row is not None and row["id"] == candidates[0]["id"]
        self.model.claim(self.model.jobs[row["id"]])
        return Attempt(Job.from_claim(row) if runtime else Job.from_row(row))

    @rule(i=st.integers(0, 50), kind=st.sampled_from(["task", "plain"]),
          queue=st.sampled_from(QUEUES), behavior=BEHAVIORS)
    def work(self, i: int, kind: str, queue: str, behavior: Behavior) -> None:
        """The harness: `AwaTestClient.work_one` claims and runs one job."""
        kind, queue = self._target(i, kind, queue)
        candidates = self.run(self.conn.fetch(HARNESS_ORDER_SQL, queue, kind))
        self.behavior = behavior
        result = self.run(self.env.harness.work_one(Task if kind == "task" else Plain,
                                                    self.handler, queue=queue))
        if not candidates:
            assert result.is_no_job()
            return
        event(f"work: {behavior.outcome} -> {result.outcome}")
        job = self.model.jobs[candidates[0]["id"]]
        assert isinstance(result.job, JobRow) and result.job.id == job.id
        self.model.claim(job)
        self.model.finish(job, behavior, self.tokens[-1] if behavior.registers else None)

    @precondition(lambda self: any(not a.finished for a in self.attempts))
    @rule(i=st.integers(0, 50), behavior=BEHAVIORS)
    def finish(self, i: int, behavior: Behavior) -> None:
        """Run the handler of a held attempt and finalize its outcome."""
        open_attempts = [a for a in self.attempts if not a.finished]
        attempt = open_attempts[i % len(open_attempts)]
        attempt.finished = True
        job = self.model.jobs[attempt.job.id]
        stale = not (job.table == "jobs" and job.state == "running"
                     and job.lease == attempt.job.run_lease)
        before = self.run(self._rows())
        self.behavior = behavior
        event(f"finish: {'stale' if stale else behavior.outcome}")
        written = self.run(self._finish(attempt, behavior.batch))
        if stale:
            assert not written or behavior.batch  # a batched completion is fire-and-forget
            assert self.run(self._rows()) == before, "a stale attempt changed the database"
            return
        self.model.finish(job, behavior, self.tokens[-1] if behavior.registers else None)

    async def _finish(self, attempt: Attempt, batch: bool) -> bool:
        ctx, early = self.executor.prepare(attempt.job)
        assert early is None and ctx is not None
        attempt.ctx = ctx
        outcome = await self.executor.run(attempt.job, ctx)
        done = await self.finalizer.finalize(attempt.job, ctx, outcome, allow_batch=batch)
        await self.completer.drain()
        return done.written

    @precondition(lambda self: any(a.ctx is not None for a in self.attempts))
    @rule(i=st.integers(0, 50), batch=st.booleans())
    def replay(self, i: int, batch: bool) -> None:
        """Finalize a finished attempt again as completed (a lost ack): nothing changes."""
        done = [a for a in self.attempts if a.finished and a.ctx is not None]
        if not done:
            return
        attempt = done[i % len(done)]
        job = self.model.jobs[attempt.job.id]
        if job.table == "jobs" and job.state == "running" and job.lease == attempt.job.run_lease:
            return
        before = self.run(self._rows())
        assert attempt.ctx is not None

        async def go() -> None:
            await self.finalizer.finalize(attempt.job, attempt.ctx, Outcome("completed"),
                                          allow_batch=batch)
            await self.completer.drain()
        self.run(go())
        assert self.run(self._rows()) == before, "a replayed completion changed the database"

    @precondition(lambda self: bool(self.model.jobs))
    @rule(i=st.integers(0, 50), delta=st.sampled_from([-1, 1]),
          kind=st.sampled_from(["completed", "retry", "snooze", "cancel", "fail"]),
          follow=st.booleans())
    def stale_write(self, i: int, delta: int, kind: str, follow: bool) -> None:
        """An outcome written under a lease that is not the job's: nothing changes."""
        job = self.model.pick(i, lambda j: j.table != "gone")
        if job is None:
            return
        before = self.run(self._rows())
        outcome = Outcome(kind, delay=60.0, error="stale")  # type: ignore[arg-type]
        followups = [awa.enqueue.producer.prepare(FollowUp(-job.id), queue=FQ)] if follow else []
        assert not self.run(self.completer.write(job.id, job.lease + delta, outcome, None,
                                                 followups))
        assert self.run(self._rows()) == before

    # -- admin ------------------------------------------------------------------------

    @precondition(lambda self: bool(self.model.jobs))
    @rule(i=st.integers(0, 50))
    def cancel(self, i: int) -> None:
        """Admin cancel: unfinished jobs are cancelled, finished ones untouched."""
        job = self.model.pick(i)
        if job is None:
            return
        result = self.run(self._call(self.client.cancel(job.id)))
        self.model.expect_cancel(job, result)

    @precondition(lambda self: bool(self.model.jobs))
    @rule(i=st.integers(0, 50))
    def admin_retry(self, i: int) -> None:
        """Admin retry: failed, cancelled or waiting jobs back to available."""
        job = self.model.pick(i)
        if job is None:
            return
        result = self.run(self._call(self.client.retry(job.id)))
        self.model.expect_admin_retry(job, result)

    @rule(by_kind=st.booleans(), kind=st.sampled_from(["task", "plain"]),
          queue=st.sampled_from(QUEUES))
    def retry_failed(self, by_kind: bool, kind: str, queue: str) -> None:
        """Bulk retry of failed jobs by kind or queue (all or nothing)."""
        call = (self.client.retry_failed(kind=kind) if by_kind
                else self.client.retry_failed(queue=queue))
        result = self.run(self._call(call))
        self.model.expect_bulk_retry(
            [j for j in self.model.live() if j.table == "done" and j.state == "failed"
             and (j.kind == kind if by_kind else j.queue == queue)], result)

    @rule(kind=st.sampled_from(["task", "plain"]))
    def discard_failed(self, kind: str) -> None:
        """Delete the failed jobs of a kind."""
        n = self.run(self.client.discard_failed(kind))
        gone = [j for j in self.model.live() if j.table == "done" and j.state == "failed"
                and j.kind == kind]
        assert n == len(gone)
        for j in gone:
            self.model.remove(j)

    @rule(queue=st.sampled_from(QUEUES), verb=st.sampled_from(["pause", "resume", "drain"]))
    def queue_action(self, queue: str, verb: str) -> None:
        """Pause, resume or drain a queue."""
        if verb == "pause":
            self.run(self.client.pause_queue(queue, "prop"))
            self.model.paused.add(queue)
        elif verb == "resume":
            self.run(self.client.resume_queue(queue))
            self.model.paused.discard(queue)
        else:
            n = self.run(self.client.drain_queue(queue))
            drained = [j for j in self.model.live() if j.queue == queue and j.table == "jobs"
                       and j.state in ("scheduled", "available", "retryable")]
            drained += self.model.drainable_parked(queue)
            assert n == len(drained)
            for j in drained:
                self.model.to_done(j, "cancelled")

    @precondition(lambda self: bool(self.model.jobs))
    @rule(i=st.integers(0, 50), verb=st.sampled_from(["move", "retry", "purge"]))
    def dlq_action(self, i: int, verb: str) -> None:
        """Move a failed job to the DLQ, retry it from there, or purge it."""
        job = self.model.pick(i)
        if job is None:
            return
        c = self.client
        call = {"move": c.move_failed_to_dlq, "retry": c.retry_from_dlq,
                "purge": c.purge_dlq_job}[verb]
        result = self.run(self._call(call(job.id)))
        self.model.expect_dlq(job, verb, result)

    @rule(verb=st.sampled_from(["retry", "purge", "move"]))
    def dlq_bulk(self, verb: str) -> None:
        """Bulk DLQ retry / purge / move over the dead-lettering queue."""
        c = self.client
        if verb == "move":
            n = self.run(c.bulk_move_failed_to_dlq(queue=DLQ_QUEUE))
            moved = [j for j in self.model.live() if j.table == "done" and j.state == "failed"
                     and j.queue == DLQ_QUEUE]
            assert n == len(moved)
            for j in moved:
                self.model.to_dlq(j)
            return
        entries = [j for j in self.model.live() if j.table == "dlq" and j.queue == DLQ_QUEUE]
        if verb == "purge":
            assert self.run(c.purge_dlq(queue=DLQ_QUEUE)) == len(entries)
            for j in entries:
                self.model.remove(j)
            return
        result = self.run(self._call(c.bulk_retry_from_dlq(queue=DLQ_QUEUE)))
        self.model.expect_bulk_retry(entries, result)

    # -- callbacks ----------------------------------------------------------------------

    @rule(i=st.integers(0, 50), which=st.sampled_from(["current", "current", "stale",
                                                         "unknown"]),
          action=st.sampled_from(["complete", "fail", "retry", "resume", "heartbeat"]))
    def resolve_callback(self, i: int, which: str, action: str) -> None:
        """Resolve a callback by id: a waiting job's, an old one, or an unknown one."""
        current = {j.callback for j in self.model.live() if j.callback}
        if which == "current" and current:
            cid = sorted(current)[i % len(current)]
        elif which == "stale" and set(self.tokens) - current:
            old = sorted(set(self.tokens) - current)
            cid = old[i % len(old)]
        else:
            cid = str(uuid.UUID(int=i + 1))
        c = self.client
        calls = {"complete": lambda: c.complete_external(cid, {"i": i}),
                 "fail": lambda: c.fail_external(cid, "external failure"),
                 "retry": lambda: c.retry_external(cid),
                 "resume": lambda: c.resume_external(cid, [i]),
                 "heartbeat": lambda: c.heartbeat_callback(cid, 60)}
        result = self.run(self._call(calls[action]()))
        self.model.expect_resolution(cid, action, result)

    # -- maintenance ----------------------------------------------------------------------

    @precondition(lambda self: self.model.any_active("running"))
    @rule(i=st.integers(0, 50))
    def rescue(self, i: int) -> None:
        """A crashed attempt: its heartbeat goes stale and the rescuer runs once."""
        job = self.model.pick(i, lambda j: j.table == "jobs" and j.state == "running")
        if job is None:
            return
        self.run(self.conn.execute(TO_MUTABLE, job.id))  # a ring attempt moves to awa.jobs
        self.run(self.conn.execute(
            "UPDATE awa.jobs SET heartbeat_at = now() - interval '1 hour' WHERE id = $1",
            job.id))
        self.run(self.rescuer.run_once())
        self.model.expect_rescue(job, callback=False)

    @precondition(lambda self: self.model.any_active("waiting_external"))
    @rule(i=st.integers(0, 50))
    def expire_callback(self, i: int) -> None:
        """A parked job's callback times out and the rescuer runs once."""
        job = self.model.pick(i, lambda j: j.table == "jobs" and j.state == "waiting_external")
        if job is None:
            return
        self.run(self.conn.execute(
            "UPDATE awa.jobs SET callback_timeout_at = now() - interval '1 second'"
            " WHERE id = $1", job.id))
        self.run(self.rescuer.run_once())
        self.model.expect_rescue(job, callback=True)

    @rule()
    def promote(self) -> None:
        """Every scheduled and retryable job falls due and is promoted."""
        self.run(self.conn.execute(
            "UPDATE awa.jobs SET run_at = now() - interval '1 second'"
            " WHERE state IN ('scheduled', 'retryable')"))
        self.run(self.promoter.run_once())
        for j in self.model.live():
            if j.table == "jobs" and j.state in ("scheduled", "retryable"):
                j.state = "available"

    async def _call(self, coro: Any) -> Any:
        """The result, or the exception an admin call raised (to compare with the model)."""
        try:
            return await coro
        except Exception as exc:
            return exc

    # -- the checks ---------------------------------------------------------------------

    @invariant()
    def database_matches_model(self) -> None:
        """Storage invariants hold and every row is what the model expects."""
        actual = {r["id"]: r for r in self.run(check_invariants(self.conn))}
        self.model.check(actual)


def test_job_state_machine(database_url: str) -> None:
    """Random operation sequences keep the database equal to the model."""
    with LoopThread() as lt:
        async def open_env() -> Env:
            client = awa.AsyncClient(database_url, max_connections=4)
            await client.pool()
            client.on_completed_enqueue(Task, lambda args, job: EnqueueRequest(
                FollowUp(job.id), queue=FQ))
            client.on_completed_enqueue(Task, lambda args, job: EnqueueRequest(
                Grouped(args.group), queue=FQ, unique_opts={}))
            client.on_exhausted_enqueue(Task, lambda args, job: EnqueueRequest(
                Exhausted(job.id), queue=FQ))
            return Env(lt, client, await connect(database_url), AwaTestClient(client))
        env = lt.run(open_env())
        machine = type("JobMachineRun", (JobMachine,), {"env": env})
        try:
            run_state_machine_as_test(machine, settings=prop_settings(
                30, stateful_step_count=50))
        finally:
            lt.run(env.conn.close())
            lt.run(env.client.close())
            env.threads.shutdown()
            env.harness._threads.shutdown()


