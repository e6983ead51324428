"""Runtime: owns a worker process's services, from `start()` to `shutdown()`.

It wires the pipeline together: dispatchers claim (one per queue), the
executor runs handlers, the completer writes outcomes, and the maintenance
services (leader election, heartbeat, promotion, rescue, cleanup) keep the
fleet healthy. A LISTEN connection turns NOTIFYs into prompt wake-ups; when
it is unavailable the dispatchers simply poll.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import asyncpg

from awa.core import states
from awa.core.model import Job, Outcome, OutcomeKind
from awa.core.outcomes import OUTCOMES
from awa.db import migrations
from awa.db.errors import translated
from awa.db.listener import Listener
from awa.db.pool import create_pool
from awa.db.queries import Queries
from awa.maintenance.base import PeriodicService
from awa.maintenance.batch import BatchRunner
from awa.maintenance.cron import CronSchedule, CronService
from awa.maintenance.leader import LeaderElection
from awa.maintenance.services import (
    UNSERVED_CHECK_INTERVAL,
    Cleaner,
    DependencyReleaser,
    Promoter,
    QueueGauges,
    Rescuer,
    UnservedQueueWarner,
    Vacuumer,
)
from awa.telemetry import joblog
from awa.telemetry import otel as telemetry
from awa.telemetry.failures import unreachable
from awa.worker import descriptors, overrides
from awa.worker.capacity import Capacity
from awa.worker.completion import Completer
from awa.worker.config import RuntimeConfig
from awa.worker.context import AttemptDb, JobContext
from awa.worker.descriptors import Scope
from awa.worker.dispatcher import Dispatcher
from awa.worker.executor import JobExecutor
from awa.worker.finalize import Finalizer
from awa.worker.followups import FollowUpRegistry, OutcomeContext, insert_followups
from awa.worker.health import HealthServer
from awa.worker.heartbeat import Heartbeat
from awa.worker.overrides import OverrideWatcher
from awa.worker.presence import PRESENCE_INTERVAL, Presence
from awa.worker.tasks import Registry

log = logging.getLogger("awa.runtime")
#: Connections of the runtime's own pool (completions, heartbeats, maintenance).
RUNTIME_POOL_SIZE = 6
#: Connections of the claim pool (claims, one per queue at a time, and completion
#: batches; the flusher and, with few queues, each dispatcher keep theirs).
CLAIM_POOL_SIZE = 3



@dataclass(frozen=True, slots=True)
class QueueHealth:
    """One queue as this process serves it."""

    in_flight: int
    available: int
    max_workers: int
    min_workers: int
    weight: int
    #: Claims that failed in a row (`CLAIM_FAILURES_UNHEALTHY` makes the worker
    #: unhealthy), and the last failure's error.
    claim_failures: int = 0
    last_claim_error: str | None = None

    @property
    def claims_failing(self) -> bool:
        """Its claims failed often enough in a row to make the worker unhealthy."""
        return self.claim_failures >= states.CLAIM_FAILURES_UNHEALTHY


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """What `health_check()` reports: the process and each of its queues."""

    healthy: bool
    postgres_connected: bool
    poll_loop_alive: bool
    heartbeat_alive: bool
    shutting_down: bool
    leader: bool
    queues: dict[str, QueueHealth] = field(default_factory=dict)
    listen_enabled: bool = False
    #: "running", "shutting down", or "not running" (no worker started in this
    #: process: then ``healthy`` speaks for the database and schema alone).
    runtime: str = "running"
    schema_compatible: bool | None = None  #: checked only when no worker runs


@dataclass(slots=True)
class _Attempt:
    lease: int
    ctx: JobContext
    queue: str


class Runtime:
    """One worker process's job-running machinery."""

    def __init__(self, pool: asyncpg.Pool, q: Queries, registry: Registry,
                 config: RuntimeConfig, database_url: str,
                 followups: FollowUpRegistry | None = None) -> None:
        self.config = config
        self.followups = followups or FollowUpRegistry()
        self._registry = registry

        self._pool = pool
        self._q = q
        self._url = database_url
        self.instance_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.capacity = Capacity(config.queues, config.global_max_workers)
        total = sum(self.capacity.limit(qc.name) for qc in config.queues)
        self._threads = ThreadPoolExecutor(max_workers=max(1, min(total, 256)),
                                           thread_name_prefix="awa-handler")
        self._executor = JobExecutor(registry, self._threads,
                                     AttemptDb(pool, q, config.poll_interval.total_seconds(),
                                               config.completed_retention))
        self.completer = Completer(pool, q, completed_retention=config.completed_retention,
                                   failed_retention=config.failed_retention)
        poll = config.poll_interval.total_seconds()
        backlog_limit = max(4 * total, 128)
        self.dispatchers = {
            qc.name: Dispatcher(qc, pool, q, self.capacity, self._launch, poll,
                                backlog=lambda: len(self.completer._pending) >= backlog_limit,
                                reject=self._reject)
            for qc in config.queues}
        self.completer.on_flushed = self._wake_all
        self.finalizer = Finalizer(self.completer, self.followups)
        self.leader = LeaderElection(pool, q, self.instance_id, config.leader_election_interval)
        self.services: list[PeriodicService] = self._make_services()
        self._attempts: dict[int, _Attempt] = {}
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (outcome, queue), not completed
        #: Running job tasks by (job id, run lease): an attempt's task removes itself.
        self._job_tasks: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._dispatch_loops: list[asyncio.Task[None]] = []
        self._stop_claiming = asyncio.Event()
        self._stop_services = asyncio.Event()
        self.listener = Listener(database_url, pool, q, config.poll_interval.total_seconds(),
                                 self._on_notify, self._wake_all)
        self._claim_pool: asyncpg.Pool | None = None
        self._runtime_pool: asyncpg.Pool | None = None
        self.health_server: HealthServer | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self.shutting_down = False

    def _make_services(self) -> list[PeriodicService]:
        c, pool, q = self.config, self._pool, self._q
        is_leader = lambda: self.leader.is_leader  # noqa: E731
        rescue_every = min(c.heartbeat_rescue_interval, c.deadline_rescue_interval,
                           c.callback_rescue_interval)
        return [
            self.leader,
            Heartbeat(pool, q, c.heartbeat_interval, self._live_attempts, self._lost),
            Promoter(pool, q, c.promote_interval, is_leader),
            DependencyReleaser(pool, q, min(c.promote_interval,
                                            states.DEPENDENCY_RELEASE_INTERVAL)),
            Rescuer(pool, q, rescue_every, is_leader, staleness=c.heartbeat_staleness,
                    failed_retention=c.failed_retention, on_rescued=self._rescued),
            # Every retention a finished job may carry: this worker's, and the
            # defaults that client-side cancels and callback resolutions use.
            Cleaner(pool, q, c.cleanup_interval, is_leader,
                    retentions=(c.completed_retention, c.failed_retention,
                                states.COMPLETED_RETENTION, states.FAILED_RETENTION),
                    batch_size=c.cleanup_batch_size, dlq_retention=c.dlq_retention,
                    failed_retention=c.failed_retention),
            Vacuumer(pool, q, states.VACUUM_CHECK_INTERVAL, is_leader),
            CronService(pool, q, c.cron_interval, is_leader),
            BatchRunner(pool, q, c.batch_interval, is_leader, instance_id=self.instance_id,
                        chunk_size=c.batch_chunk_size),
            Presence(pool, q, PRESENCE_INTERVAL, self.instance_id, self._presence),
            QueueGauges(pool, q, is_leader),
            OverrideWatcher(pool, q, [qc.name for qc in c.queues], self._apply_override),
            UnservedQueueWarner(pool, q, UNSERVED_CHECK_INTERVAL, self._registry.kinds),
        ]

    def _apply_override(self, queue: str, row: Any | None) -> None:
        base = next(qc for qc in self.config.queues if qc.name == queue)
        cfg, poll = overrides.effective(base, self.config.poll_interval.total_seconds(), row)
        self.dispatchers[queue].reconfigure(cfg, poll)

    def service(self, name: str) -> PeriodicService:
        """The service called ``name`` (tests drive them with ``run_once``)."""
        return next(s for s in self.services if s.name == name)

    async def register(self, schedules: dict[str, CronSchedule],
                       declared: dict[tuple[Scope, str], dict[str, Any]] | None = None) -> None:
        """Record this worker's queue settings, schedules and descriptors in the database."""
        await descriptors.sync(self._pool, self._q, self.instance_id, declared or {})
        queues = list(self.config.queues)
        with translated():
            await self._pool.execute(self._q["queue_set_dlq"], [qc.name for qc in queues],
                                     [self.config.dlq_enabled(qc) for qc in queues])
            keyed = [qc for qc in queues if qc.key_max_in_flight is not None]
            if keyed:
                await self._pool.execute(self._q["queue_set_key_limit"],
                                         [qc.name for qc in keyed],
                                         [qc.key_max_in_flight for qc in keyed])
            for schedule in schedules.values():
                await self._pool.execute(self._q["cron_upsert"], *schedule.upsert_params())

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        telemetry.detect()
        # Both of the runtime's own pools give up on a statement after
        # RUNTIME_STATEMENT_TIMEOUT, end a session left idle in a transaction
        # (a half-open client), and never JIT; the claim pool reuses plans for
        # a moment, the runtime pool plans afresh (see create_pool).
        timeout = states.RUNTIME_STATEMENT_TIMEOUT.total_seconds()

        async def own_pool(name: str, size: int,
                           plans: Literal["custom", "reused"]) -> asyncpg.Pool:
            return await create_pool(self._url, max_connections=size, application_name=name,
                                     command_timeout=timeout,
                                     idle_in_transaction_timeout=timeout, plans=plans)

        # Claims go through their own small pool, so they never queue behind
        # outcomes; they commit durably (see attempt_claim). Plain
        # completion batches share it: both reuse their plans (see create_pool).
        # The runtime's own statements (completions, heartbeats, maintenance) use
        # a small pool of their own: a handler that holds every client
        # connection cannot starve heartbeats, and a half-open connection fails
        # its statement instead of hanging the worker. Both connect at once.
        made = await asyncio.gather(own_pool("awa-claim", CLAIM_POOL_SIZE, "reused"),
                                    own_pool("awa-runtime", RUNTIME_POOL_SIZE, "custom"),
                                    return_exceptions=True)
        failed = next((p for p in made if isinstance(p, BaseException)), None)
        if failed is not None:  # close the one that opened, then fail the start
            for pool in (p for p in made if isinstance(p, asyncpg.Pool)):
                await pool.close()
            raise failed
        self._claim_pool, self._runtime_pool = cast(list[asyncpg.Pool], made)
        self.completer.use_pool(self._runtime_pool, batch_pool=self._claim_pool)
        self._executor.use_control_pool(self._runtime_pool)
        for svc in self.services:
            svc.use_pool(self._runtime_pool)
        # The completion flusher keeps one claim connection; so does each
        # dispatcher while they leave one to share (a worker of many queues
        # borrows per claim instead of holding a connection per queue).
        keep = len(self.dispatchers) < CLAIM_POOL_SIZE
        for d in self.dispatchers.values():
            d.use_pool(self._claim_pool, keep_connection=keep)
        self.completer.start()
        if self.config.health_addr:
            self.health_server = HealthServer(self.config.health_addr, self._liveness,
                                              self._readiness, self.metrics_text)
            await self.health_server.start()
        if self.config.listen:
            self._listen_task = asyncio.create_task(self.listener.run(self._stop_services),
                                                    name="awa-listen")
        for svc in self.services:  # presence, the jobs_done partitions (before claiming)
            try:
                await svc.prepare()
            except Exception:  # each is retried by its periodic pass
                log.warning("%s: could not prepare", svc.name, exc_info=True)
        for svc in self.services:
            self._loops.append(asyncio.create_task(svc.run(self._stop_services),
                                                   name=f"awa-{svc.name}"))
        self._dispatch_loops = [
            asyncio.create_task(d.run(self._stop_claiming), name=f"awa-dispatch-{name}")
            for name, d in self.dispatchers.items()]

    async def shutdown(self, timeout: float) -> None:
        """Stop claiming, let handlers finish up to ``timeout`` s, then abandon the rest."""
        self.shutting_down = True
        self._stop_claiming.set()
        for d in self.dispatchers.values():
            d.wake()
        # Claims in flight land first; jobs claimed ahead go back to the queue.
        if self._dispatch_loops:
            _, stuck = await asyncio.wait(self._dispatch_loops, timeout=max(timeout, 1.0))
            for task in stuck:
                task.cancel()
            await asyncio.gather(*self._dispatch_loops, return_exceptions=True)
        if self._job_tasks:
            # Handlers that poll job.is_cancelled() may wind down within the timeout.
            for attempt in list(self._attempts.values()):
                attempt.ctx._cancel()
            _, pending = await asyncio.wait(set(self._job_tasks.values()), timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("abandoned %d running jobs at shutdown; rescue will retry them",
                            len(pending))
                await asyncio.gather(*pending, return_exceptions=True)
        await self.completer.stop(timeout=max(timeout, 5.0))
        if self._claim_pool is not None:
            await self._claim_pool.close()
        self._stop_services.set()
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self._listen_task is not None:
            self._listen_task.cancel()
            await asyncio.gather(self._listen_task, return_exceptions=True)
        await self.listener.close()
        if self.health_server is not None:
            await self.health_server.stop()
        try:
            await self.leader.resign()
            await cast(Presence, self.service("presence")).remove()
        except Exception as exc:  # a lost database: one line, its traceback says nothing more
            log.warning("could not resign leadership or remove presence: %r", exc,
                        exc_info=not unreachable(exc))
        if self._runtime_pool is not None:
            await self._runtime_pool.close()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def handlers_in_threads(self) -> int:
        """Plain ``def`` handlers still running in the thread pool (after `shutdown`:
        the ones abandoned at its timeout, whose jobs rescue will retry). Python
        cannot stop a thread; ``awa worker`` exits without waiting for them."""
        return self._executor.in_threads()

    # -- running jobs -------------------------------------------------------------------

    def _launch(self, job: Job) -> None:
        wait = None
        if job.attempted_at is not None:
            wait = (job.attempted_at - job.run_at_datetime).total_seconds()
            self.completer.observe_wait(job.queue, wait)
        telemetry.claimed(job, wait)
        # The loop's own create_task: asyncio.create_task adds a Python call and a
        # task-name step per job.
        self._job_tasks[(job.id, job.run_lease)] = \
            asyncio.get_running_loop().create_task(self._run(job))

    def _reject(self, job_id: int, lease: int, error: str) -> None:
        """Fail a claimed job that cannot even be decoded (see `Dispatcher`)."""
        async def fail() -> None:
            try:
                await self.completer.write(job_id, lease, Outcome("fail", error=error,
                                                                  terminal=True))
            finally:
                self._job_tasks.pop((job_id, lease), None)
        self._job_tasks[(job_id, lease)] = asyncio.create_task(fail())

    async def _run(self, job: Job) -> None:
        """Run one job. The slot frees when the handler returns; the completion
        backlog is bounded separately (see `Dispatcher`). The task leaves
        `_job_tasks` itself: a done callback would cost the loop a turn per job."""
        try:
            ctx, outcome = self._executor.prepare(job)
            if ctx is not None:
                self._attempts[job.id] = _Attempt(job.run_lease, ctx, job.queue)
                if self.followups.has_hooks:
                    self.followups.emit("started", job)
                started = time.perf_counter()
                try:
                    outcome = await self._executor.run(job, ctx)
                except asyncio.CancelledError:
                    # Shutdown abandoned the handler: the job stays running and is
                    # rescued once its heartbeat goes stale; staged follow-ups go with it.
                    ctx._cancel()
                    self._attempts.pop(job.id, None)
                    self._release(job.queue)
                    raise
                self.dispatchers[job.queue].ran(time.perf_counter() - started)
            self._release(job.queue)
            assert outcome is not None
            if ctx is not None and self.finalizer.batched(job, ctx, outcome):
                telemetry.outcome(job, "completed")  # the common case, without a coroutine
            else:
                await self._record(job, ctx, outcome)
        finally:
            attempt = self._attempts.get(job.id)
            if attempt is not None and attempt.lease == job.run_lease:
                del self._attempts[job.id]
            self._job_tasks.pop((job.id, job.run_lease), None)

    async def _record(self, job: Job, ctx: JobContext | None, outcome: Outcome) -> None:
        """Write the outcome with its follow-ups; fire hooks once it has committed."""
        done = await self.finalizer.finalize(job, ctx, outcome, allow_batch=True)
        if not done.written:
            log.info("outcome of job %d not written (stale lease, or left for rescue)", job.id)
            return
        telemetry.outcome(job, done.outcome.kind)
        joblog.outcome(job, done.outcome.kind, done.outcome.error, done.outcome.terminal)
        if done.outcome.kind != "completed":
            self.outcomes[(done.outcome.kind, job.queue)] += 1
        if done.trigger is not None:
            self.followups.emit(done.trigger, job, done.outcome.error)

    async def _rescued(self, rows: list[Any]) -> None:
        """After a rescue commits: registered ``rescued`` specs (best effort) and hooks."""
        for row in rows:
            try:
                found = await self._pool.fetchrow(self._q["job_get"], row["id"])
            except Exception:
                continue
            if found is None:
                continue
            job = Job.from_row(found)
            self.followups.emit("rescued", job, job.errors[-1]["error"] if job.errors else None)
            if not self.followups.has_specs("rescued", job.kind):
                continue
            requests = self.followups.build("rescued", job, OutcomeContext("rescued"))
            try:
                async with self._pool.acquire() as conn, conn.transaction():
                    await insert_followups(conn, self._q, requests, trigger_id=job.id)
            except Exception:
                log.exception("rescued follow-ups of job %d not inserted", job.id)

    def _wake_all(self) -> None:
        for d in self.dispatchers.values():
            d.wake()

    def _release(self, queue: str) -> None:
        self.capacity.release(queue)
        if self.config.weighted:
            for d in self.dispatchers.values():
                d.slot_freed()
        else:
            self.dispatchers[queue].slot_freed()

    def _live_attempts(self) -> list[tuple[int, int, JobContext | None]]:
        """Attempts to heartbeat: running handlers, jobs claimed ahead, and
        completions not yet written."""
        live: list[tuple[int, int, JobContext | None]] = [
            (job_id, a.lease, a.ctx) for job_id, a in self._attempts.items()]
        live.extend((job.id, job.run_lease, None)
                    for d in self.dispatchers.values() for job in d.ready)
        live.extend((job_id, lease, None) for job_id, lease in self.completer.pending().items()
                    if job_id not in self._attempts)
        return live

    def _lost(self, job_id: int) -> None:
        attempt = self._attempts.get(job_id)
        if attempt is not None:
            attempt.ctx._cancel()
            return
        for d in self.dispatchers.values():
            if d.forget(job_id):
                return

    # -- LISTEN -------------------------------------------------------------------------

    def _on_notify(self, channel: str, payload: str) -> None:
        """A notification from the `Listener`: wake a queue, drop an attempt, or wake a waiter."""
        if channel == "awa_jobs":
            d = self.dispatchers.get(payload)
            if d is not None:
                d.wake()
        elif channel == "awa_cancel" and payload.isdigit():
            self._lost(int(payload))
        elif channel == "awa_callback" and payload.isdigit():
            attempt = self._attempts.get(int(payload))
            if attempt is not None:
                attempt.ctx._notify()

    @property
    def listening(self) -> bool:
        return self.listener.listening

    # -- health listener and metrics ------------------------------------------------

    def _liveness(self) -> dict[str, Any]:
        return {"alive": True, "shutting_down": self.shutting_down,
                "instance": self.instance_id}

    async def _readiness(self) -> tuple[bool, dict[str, Any]]:
        health = await self.health()
        schema_ok = False
        if health.postgres_connected:
            try:
                async with self._pool.acquire() as conn:
                    await migrations.check(conn, self._q.schema)
                schema_ok = True
            except Exception:
                schema_ok = False
        fields = {"postgres_connected": health.postgres_connected,
                  "schema_compatible": schema_ok, "poll_loop_alive": health.poll_loop_alive,
                  "heartbeat_alive": health.heartbeat_alive,
                  "claims_ok": not any(h.claims_failing for h in health.queues.values()),
                  "shutting_down": health.shutting_down}
        ok = all(v for k, v in fields.items() if k != "shutting_down") \
            and not health.shutting_down
        failing = {name: h.last_claim_error for name, h in health.queues.items()
                   if h.claims_failing}
        return ok, {"ready": ok, **fields, **({"failing_queues": failing} if failing else {})}

    def metrics_text(self) -> str:
        """Prometheus text exposition of this process's counters and gauges."""
        lines = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}"])
            lines.extend(f"{name}{labels} {value}" for labels, value in samples)

        def per_queue(values: dict[str, float]) -> list[tuple[str, float]]:
            return [(f'{{queue="{telemetry.prometheus_label(q)}"}}', v)
                    for q, v in values.items()]

        metric("awa_job_claimed_total", "counter", "Jobs claimed by this process.",
               per_queue({n: d.claimed for n, d in self.dispatchers.items()}))
        metric("awa_job_completed_total", "counter", "Completions written by this process.",
               [("", self.completer.completed)])
        counted: tuple[tuple[OutcomeKind, str], ...] = (
            ("fail", "Jobs failed for good"), ("retry", "Failed attempts to be retried"),
            ("cancel", "Handlers that returned Cancel"))
        for kind, what in counted:
            name = OUTCOMES[kind].telemetry
            metric(f"awa_job_{name}_total", "counter", f"{what} by this process.",
                   per_queue({n: self.outcomes[(kind, n)] for n in self.dispatchers}))
        metric("awa_job_in_flight", "gauge", "Handlers running now.",
               per_queue({n: sum(1 for a in self._attempts.values() if a.queue == n)
                          for n in self.dispatchers}))
        rescuer = self.service("rescue")
        metric("awa_maintenance_rescues_total", "counter", "Attempts rescued by this leader.",
               [("", getattr(rescuer, "rescued", 0))])
        metric("awa_maintenance_leader", "gauge", "1 while this process leads maintenance.",
               [("", 1 if self.leader.is_leader else 0)])
        return "\n".join(lines) + "\n"

    def _presence(self) -> dict[str, Any]:
        in_flight: dict[str, int] = {}
        for a in self._attempts.values():
            in_flight[a.queue] = in_flight.get(a.queue, 0) + 1
        return {"is_leader": self.leader.is_leader, "listening": self.listening,
                "in_flight": len(self._attempts),
                "claimed": sum(d.claimed for d in self.dispatchers.values()),
                "completed": self.completer.completed,
                "queues": {n: {"max_workers": self.capacity.limit(n),
                               "in_flight": in_flight.get(n, 0)} for n in self.dispatchers}}

    # -- health -------------------------------------------------------------------------

    async def health(self) -> HealthCheck:
        try:
            await self._pool.fetchval("SELECT 1")
            connected = True
        except Exception:
            connected = False
        now = time.monotonic()
        poll_limit = max(5.0, self.config.poll_interval.total_seconds() * 10)
        poll_alive = not self._stop_claiming.is_set() and all(
            now - d.last_loop_at < poll_limit or self.capacity.free(n) == 0
            for n, d in self.dispatchers.items())
        hb = self.service("heartbeat")
        hb_alive = not self._stop_services.is_set() and hb.last_run_at is not None and (
            now - hb.last_run_at < hb.interval * 3)
        available: dict[str, int] = {}
        if connected:
            rows = await self._pool.fetch(
                self._q["queue_available_counts"], list(self.dispatchers))
            available = {r["queue"]: r["n"] for r in rows}
        queues = {
            qc.name: QueueHealth(
                in_flight=sum(1 for a in self._attempts.values() if a.queue == qc.name),
                available=available.get(qc.name, 0),
                max_workers=self.capacity.limit(qc.name), min_workers=qc.min_workers,
                weight=qc.weight, claim_failures=self.dispatchers[qc.name].claim_failures,
                last_claim_error=self.dispatchers[qc.name].last_claim_error)
            for qc in self.config.queues}
        claiming = not any(h.claims_failing for h in queues.values())
        return HealthCheck(
            healthy=connected and poll_alive and hb_alive and claiming
            and not self.shutting_down,
            postgres_connected=connected, poll_loop_alive=poll_alive, heartbeat_alive=hb_alive,
            shutting_down=self.shutting_down, leader=self.leader.is_leader, queues=queues,
            listen_enabled=self.listening,
            runtime="shutting down" if self.shutting_down else "running")
