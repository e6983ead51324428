"""Runtime: owns a worker process's services, from `start()` to `shutdown()`.

It wires the pipeline together and starts and stops it; the work is done by
the parts it makes. Dispatchers claim (one per queue) and hand each job to
the `JobRunner` (`awa.worker.running`: executor, attempts table, finalizer,
completer: a job's path from claim to written outcome, as calls). The
maintenance services (leader election, heartbeat, promotion, rescue, cleanup)
keep the fleet healthy. A LISTEN connection's notifications are routed by
`Notifications` into prompt wake-ups; when it is unavailable the dispatchers
simply poll. Health, Prometheus metrics and presence are read from these
parts by `health`, `metrics` and `presence`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Literal, cast

import asyncpg

from awa.core import states
from awa.db.errors import translated
from awa.db.lanes import Lanes
from awa.db.listener import Listener
from awa.db.pool import close_pool_within, create_pool
from awa.db.queries import Queries
from awa.maintenance.base import PeriodicService
from awa.maintenance.batch import BatchRunner
from awa.maintenance.cron import CronSchedule, CronService
from awa.maintenance.leader import LeaderElection
from awa.maintenance.ring import RingKeeper
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
from awa.telemetry import otel as telemetry
from awa.telemetry.failures import unreachable
from awa.worker import descriptors, overrides, presence
from awa.worker.attempts import Attempts
from awa.worker.capacity import Capacity
from awa.worker.completion import Completer
from awa.worker.config import RuntimeConfig
from awa.worker.context import AttemptDb
from awa.worker.descriptors import Scope
from awa.worker.dispatcher import Dispatcher
from awa.worker.executor import JobExecutor
from awa.worker.finalize import Finalizer
from awa.worker.followups import FollowUpRegistry, after_rescue
from awa.worker.health import HealthCheck, HealthServer, QueueHealth, WorkerHealth
from awa.worker.heartbeat import Heartbeat, LiveAttempt
from awa.worker.metrics import metrics_text
from awa.worker.notifications import Notifications
from awa.worker.overrides import OverrideWatcher
from awa.worker.presence import PRESENCE_INTERVAL, Presence
from awa.worker.running import JobRunner
from awa.worker.tasks import Registry

__all__ = ["CLAIM_POOL_SIZE", "RUNTIME_POOL_SIZE", "HealthCheck", "QueueHealth", "Runtime"]

log = logging.getLogger("awa.runtime")
#: Connections of the runtime's own pool (completions, heartbeats, maintenance).
RUNTIME_POOL_SIZE = 6
#: Connections of the claim pool (claims, one per queue at a time, and completion
#: batches; the flusher and, with few queues, each dispatcher keep theirs).
CLAIM_POOL_SIZE = 3
#: The application_name of the claim pool's and the runtime pool's connections: the
#: leader's rescue pass ends such a session stalled mid-statement (see `Rescuer`).
CLAIM_POOL_NAME = "awa-claim"
RUNTIME_POOL_NAME = "awa-runtime"



class Runtime:
    """One worker process's job-running machinery: what it is made of, and its
    start and shutdown."""

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
        poll = config.poll_interval.total_seconds()
        # The job path: dispatchers claim, the runner runs and finalizes, the completer writes.
        self.capacity = Capacity(config.queues, config.global_max_workers)
        total = sum(self.capacity.limit(qc.name) for qc in config.queues)
        self._threads = ThreadPoolExecutor(max_workers=max(1, min(total, 256)),
                                           thread_name_prefix="awa-handler")
        self._executor = JobExecutor(registry, self._threads,
                                     AttemptDb(pool, q, poll, config.completed_retention))
        self.completer = Completer(pool, q, completed_retention=config.completed_retention,
                                   failed_retention=config.failed_retention)
        self.finalizer = Finalizer(self.completer, self.followups)
        self._attempts = Attempts()
        self.dispatchers: dict[str, Dispatcher] = {}
        self.runner = JobRunner(self._executor, self.finalizer, self.completer, self.followups,
                                self._attempts, self.capacity, self.dispatchers,
                                weighted=config.weighted)
        backlog_limit = max(4 * total, 128)
        lanes = Lanes(q)  # one cached read of the ring's switch for every queue
        self.dispatchers.update(
            (qc.name, Dispatcher(qc, pool, q, self.capacity, self.runner.launch, poll,
                                 backlog=lambda: self.completer.queued >= backlog_limit,
                                 reject=self.runner.reject, lanes=lanes))
            for qc in config.queues)
        # Wake-ups: NOTIFYs, lost leases and flushed completions.
        self.notifications = Notifications(self.dispatchers, self._attempts)
        self.completer.on_flushed = self.notifications.wake_all
        self.listener = Listener(database_url, q, poll, self.notifications.on_notify,
                                 self.notifications.wake_all)
        # Maintenance, and what the process says about itself.
        self.leader = LeaderElection(pool, q, self.instance_id, config.leader_election_interval)
        self.services: list[PeriodicService] = self._make_services()
        self._loops: list[asyncio.Task[None]] = []
        self._dispatch_loops: list[asyncio.Task[None]] = []
        #: The services' preparations, and the step that lets jobs start (`start`).
        self._preparing: list[asyncio.Task[None]] = []
        self._opening: asyncio.Task[None] | None = None
        self._stop_claiming = asyncio.Event()
        self._stop_services = asyncio.Event()
        self._health = WorkerHealth(
            pool, q, config, self.instance_id, self.dispatchers, self.capacity, self._attempts,
            self.service("heartbeat"), self.leader, self.listener,
            claiming_stopped=self._stop_claiming, services_stopped=self._stop_services)
        self._claim_pool: asyncpg.Pool | None = None
        self._runtime_pool: asyncpg.Pool | None = None
        self.health_server: HealthServer | None = None
        self._listen_task: asyncio.Task[None] | None = None

    @property
    def shutting_down(self) -> bool:
        """`shutdown` began: no more claims."""
        return self._stop_claiming.is_set()

    def _make_services(self) -> list[PeriodicService]:
        c, pool, q = self.config, self._pool, self._q
        is_leader = lambda: self.leader.is_leader  # noqa: E731
        rescue_every = min(c.heartbeat_rescue_interval, c.deadline_rescue_interval,
                           c.callback_rescue_interval)
        return [
            self.leader,
            Heartbeat(pool, q, c.heartbeat_interval, self._live_attempts,
                      self.notifications.lost),
            Promoter(pool, q, c.promote_interval, is_leader),
            DependencyReleaser(pool, q, min(c.promote_interval,
                                            states.DEPENDENCY_RELEASE_INTERVAL)),
            Rescuer(pool, q, rescue_every, is_leader, staleness=c.heartbeat_staleness,
                    failed_retention=c.failed_retention,
                    on_rescued=partial(after_rescue, pool, q, self.followups),
                    stalled_sessions=(CLAIM_POOL_NAME, RUNTIME_POOL_NAME),
                    stalled_after=states.RUNTIME_STATEMENT_TIMEOUT),
            # Every retention a finished job may carry: this worker's, and the
            # defaults that client-side cancels and callback resolutions use.
            Cleaner(pool, q, c.cleanup_interval, is_leader,
                    retentions=(c.completed_retention, c.failed_retention,
                                states.COMPLETED_RETENTION, states.FAILED_RETENTION),
                    batch_size=c.cleanup_batch_size, dlq_retention=c.dlq_retention,
                    failed_retention=c.failed_retention),
            Vacuumer(pool, q, states.VACUUM_CHECK_INTERVAL, is_leader),
            RingKeeper(pool, q, states.RING_ROTATE_INTERVAL, is_leader),
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
        # a moment, the runtime pool plans afresh (see create_pool). A session
        # whose client vanished mid-statement, where no server timeout applies,
        # is ended by the leader's rescue pass (Rescuer, by application_name).
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
        made = await asyncio.gather(own_pool(CLAIM_POOL_NAME, CLAIM_POOL_SIZE, "reused"),
                                    own_pool(RUNTIME_POOL_NAME, RUNTIME_POOL_SIZE, "custom"),
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
        if self.config.health_addr:
            self.health_server = HealthServer(self.config.health_addr,
                                              self._health.liveness,
                                              self._health.readiness, self.metrics_text)
            await self.health_server.start()
        if self.config.listen:
            self._listen_task = asyncio.create_task(self.listener.run(self._stop_services),
                                                    name="awa-listen")
        # Claiming and every service's preparation (presence on the runtime page,
        # the partitions) start at once, each on a connection of its own. No
        # claimed job starts, so no outcome is written, until the preparations
        # marked `before_jobs` are done (the cleanup's jobs_done partitions the
        # first outcomes land in: every outcome, not only the completer's), and
        # no loop of a service that may write one runs before them either. A
        # new session's first claim plans awa.claim's statements and a fresh
        # database's first start makes its partitions, tens of milliseconds
        # each: they need not follow each other. Every loop, and the step that
        # lets jobs start, is a task of its own before the first wait, so a
        # start() cancelled meanwhile leaves them running (and shutdown() stops
        # them; jobs claimed and never started go back).
        for d in self.dispatchers.values():
            d.hold_starts()
        self._dispatch_loops = [
            asyncio.create_task(d.run(self._stop_claiming), name=f"awa-dispatch-{name}")
            for name, d in self.dispatchers.items()]
        self._preparing = [asyncio.create_task(self._prepare(svc)) for svc in self.services]
        first = [p for svc, p in zip(self.services, self._preparing, strict=True)
                 if svc.before_jobs]
        self._opening = asyncio.create_task(self._open_jobs(first), name="awa-open-jobs")
        for svc, prep in zip(self.services, self._preparing, strict=True):
            waits = [prep, *first] if svc.waits_for_partitions else [prep]
            self._loops.append(asyncio.create_task(self._run_after(svc, waits),
                                                   name=f"awa-{svc.name}"))
        # start() returns with jobs allowed to start and presence on the runtime page.
        await asyncio.wait([self._opening, *self._preparing])

    async def _open_jobs(self, first: list[asyncio.Task[None]]) -> None:
        """Once ``first`` (the partitions) are done, let claimed jobs start and
        completions be written; not if the worker is already stopping."""
        if first:
            await asyncio.wait(first)
        if self._stop_claiming.is_set():
            return
        self.completer.start()
        for d in self.dispatchers.values():
            d.allow_starts()

    async def _run_after(self, svc: PeriodicService, preps: list[asyncio.Task[None]]) -> None:
        """Run ``svc``'s loop once ``preps`` are done (its own preparation, and the
        partitions' if it `waits_for_partitions`), unless the worker is stopping by
        then (shutdown cancels what is still preparing: the partitions may not exist)."""
        await asyncio.wait(preps)
        if not self._stop_claiming.is_set():
            await svc.run(self._stop_services)

    @staticmethod
    async def _prepare(svc: PeriodicService) -> None:
        try:
            await svc.prepare()
        except Exception:  # each is retried by its periodic pass
            log.warning("%s: could not prepare", svc.name, exc_info=True)

    async def shutdown(self, timeout: float) -> None:
        """Stop claiming, let handlers finish up to ``timeout`` s, then abandon the rest."""
        self._stop_claiming.set()
        # A start still preparing (cancelled, or run beside this): nothing more waits
        # for its preparations, and jobs are not let start.
        for prep in self._preparing:
            prep.cancel()
        if self._opening is not None:
            await asyncio.gather(self._opening, return_exceptions=True)
        for d in self.dispatchers.values():
            d.wake()
        # Claims in flight land first; jobs claimed ahead go back to the queue.
        if self._dispatch_loops:
            _, stuck = await asyncio.wait(self._dispatch_loops, timeout=max(timeout, 1.0))
            for task in stuck:
                task.cancel()
            await asyncio.gather(*self._dispatch_loops, return_exceptions=True)
        await self.runner.finish(timeout)
        await self.completer.stop(timeout=max(timeout, 5.0))
        # The claim pool closes while the services stop (each on its own pool);
        # whatever fails, the runtime pool and the threads are let go too.
        results = await asyncio.gather(*((close_pool_within(self._claim_pool),)
                                         if self._claim_pool is not None else ()),
                                       self._stop_the_rest(), return_exceptions=True)
        if self._runtime_pool is not None:
            await close_pool_within(self._runtime_pool)
        self._threads.shutdown(wait=False, cancel_futures=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed

    async def _stop_the_rest(self) -> None:
        """Stop the services, the listener and the health server; leave the cluster."""
        self._stop_services.set()
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self._listen_task is not None:
            self._listen_task.cancel()
            await asyncio.gather(self._listen_task, return_exceptions=True)
        await self.listener.close()
        if self.health_server is not None:
            await self.health_server.stop()
        results = await asyncio.gather(self.leader.resign(),
                                       cast(Presence, self.service("presence")).remove(),
                                       return_exceptions=True)
        exc = next((r for r in results if isinstance(r, Exception)), None)
        if exc is not None:  # a lost database: one line, its traceback says nothing more
            log.warning("could not resign leadership or remove presence: %r", exc,
                        exc_info=not unreachable(exc))

    def handlers_in_threads(self) -> int:
        """Plain ``def`` handlers still running in the thread pool (after `shutdown`:
        the ones abandoned at its timeout, whose jobs rescue will retry). Python
        cannot stop a thread; ``awa worker`` exits without waiting for them."""
        return self._executor.in_threads()

    # -- what the parts read ---------------------------------------------------------

    def _live_attempts(self) -> list[LiveAttempt]:
        """Attempts to heartbeat: running handlers, jobs claimed ahead, and
        completions not yet written."""
        live: list[LiveAttempt] = [*self._attempts.leases()]
        live.extend((job.id, job.run_lease, None, job.receipt_slot)
                    for d in self.dispatchers.values() for job in d.ready)
        live.extend((job_id, lease, None, slot)
                    for job_id, (lease, slot) in self.completer.pending().items()
                    if job_id not in self._attempts)
        return live

    @property
    def listening(self) -> bool:
        return self.listener.listening

    async def health(self) -> HealthCheck:
        """This process's health (`client.health_check()`)."""
        return await self._health.check()

    def metrics_text(self) -> str:
        """Prometheus text exposition of this process's counters and gauges."""
        return metrics_text(self.dispatchers, self.completer, self.runner.outcomes,
                            self._attempts, cast(Rescuer, self.service("rescue")), self.leader)

    def _presence(self) -> dict[str, Any]:
        return presence.snapshot(self.leader, self.listening, self._attempts, self.dispatchers,
                                 self.completer, self.capacity)
