"""`AsyncClient`: the front door. Enqueue, inspect and administer jobs.

Each operation is written once here (async); the sync `awa.Client` delegates
to it. The worker methods (`task`, `start`, `shutdown`, `health_check`) are
defined here too: `start` builds an `awa.worker.runtime.Runtime` from the
registered tasks and runs it in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import warnings
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, TypeVar, Unpack

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from awa.admin.batch import BatchOps
from awa.admin.descriptors import DescriptorOps
from awa.admin.flow import FlowOps
from awa.admin.ops import AdminOps
from awa.admin.overrides import OverrideOps
from awa.core import serialize, states, validate
from awa.core.errors import ValidationError
from awa.core.options import EnqueueOptions
from awa.core.results import InsertedJob
from awa.db import dsn, migrations
from awa.db.errors import translated
from awa.db.lanes import Lanes
from awa.db.pool import Conn, close_pool_within, create_pool, resolve_database_url
from awa.db.queries import Queries, queries
from awa.enqueue.pacing import Pacer
from awa.enqueue.pipeline import PerJob, Pipeline
from awa.enqueue.transaction import Transaction, TransactionStart
from awa.enqueue.workflow import Node, WorkflowRun, insert_workflow
from awa.maintenance.cron import CronSchedule
from awa.telemetry import otel as telemetry
from awa.worker import callbacks
from awa.worker.config import RuntimeConfig, check_start
from awa.worker.descriptors import Scope
from awa.worker.followups import FollowUpRegistry, JobEvent, trigger_kind
from awa.worker.runtime import HealthCheck, Runtime
from awa.worker.tasks import Handler, Registry, make_spec

FollowUpFn = Callable[..., Any]
EventFn = Callable[[JobEvent], Any]


T = TypeVar("T")
log = logging.getLogger("awa.client")


class AsyncClient(AdminOps, BatchOps, DescriptorOps, OverrideOps, FlowOps):
    """A pool-backed client for one database and schema (default ``awa``).

    With no ``database_url``, ``$DATABASE_URL`` is used, else the embedded
    PostgreSQL is started on first use. ``command_timeout`` (seconds) bounds
    every statement on this client's pool, yours included: set it where the
    network can silently drop connections (the worker's own statements always
    have `states.RUNTIME_STATEMENT_TIMEOUT`).
    """

    def __init__(self, database_url: str | None = None, max_connections: int = 10, *,
                 schema: str = "awa", command_timeout: float | None = None) -> None:
        validate.check_int("max_connections", max_connections, 1, 10_000)
        if command_timeout is not None:
            validate.check_seconds("command_timeout", command_timeout)
        self._command_timeout = command_timeout
        self._url = None if database_url is None else dsn.check_url(database_url, "database_url")
        if database_url is None and os.environ.get("DATABASE_URL"):  # say so here, not mid-run
            dsn.check_url(os.environ["DATABASE_URL"], "$DATABASE_URL")
        self._max_connections = max_connections
        self._q: Queries = queries(schema)
        self._lanes = Lanes(self._q)  # where plain jobs go (migration 0020), cached
        self._pool: asyncpg.Pool | None = None
        self._pool_lock = asyncio.Lock()
        self.retention_cancelled = states.FAILED_RETENTION
        self._producer_conn: PoolConnectionProxy | None = None
        self._producer_lock = asyncio.Lock()
        self._letting_go: set[asyncio.Task[None]] = set()  # kept connections' releases
        self._registry = Registry()
        self._followups = FollowUpRegistry(router=self._registry.queue_for)
        self._schedules: dict[str, CronSchedule] = {}
        self._descriptors: dict[tuple[Scope, str], dict[str, Any]] = {}
        self._runtime: Runtime | None = None
        callbacks.at_hand(self._q.schema, self._callback_resolver)  # awa.bridge resolves with it
        self._enqueue = self._pipeline()

    def _pipeline(self) -> Pipeline:
        """The enqueue pipeline on this client's producer connection (its routing,
        waiter and depth record)."""
        return Pipeline(self._q, self._producer, router=self._registry.queue_for,
                        waiter=self.wait_for, seen=self._record_depths, lanes=self._lanes)

    @property
    def schema(self) -> str:
        """The schema holding Awa's tables."""
        return self._q.schema

    async def database_url(self) -> str:
        """The URL in use (resolving the default, which may start the embedded server)."""
        if self._url is None:
            self._url = await asyncio.to_thread(resolve_database_url, None)
        return self._url

    async def pool(self) -> asyncpg.Pool:
        """The connection pool, created on first use."""
        if self._pool is None:
            async with self._pool_lock:
                if self._pool is None:
                    self._loop = asyncio.get_running_loop()  # for wait_for_sync from threads
                    url = await self.database_url()
                    with translated():
                        self._pool = await create_pool(url, max_connections=self._max_connections,
                                                       command_timeout=self._command_timeout)
                    # The producer connection kept between inserts goes back to the
                    # pool whenever someone would otherwise wait for one.
                    self._pool.on_demand = self._let_go_if_idle
                    telemetry.detect()
        return self._pool

    async def close(self) -> None:
        """Shut any running worker down, then close the pool."""
        if self._runtime is not None:
            await self.shutdown()
        await self._close_flow()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            held, self._producer_conn = self._producer_conn, None
            try:
                if held is not None:
                    await pool.release(held)
                await asyncio.gather(*self._letting_go, return_exceptions=True)
            finally:
                await close_pool_within(pool)

    async def __aenter__(self) -> AsyncClient:
        await self.pool()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    # -- schema ---------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Apply pending migrations (safe from many processes at once)."""
        pool = await self.pool()
        with translated():
            async with pool.acquire() as conn:
                return await migrations.apply(conn, self.schema)

    async def check_schema(self) -> int:
        """Raise `SchemaNotMigrated` unless the schema matches this code's version."""
        pool = await self.pool()
        async with pool.acquire() as conn:
            return await migrations.check(conn, self.schema)

    # -- storage compatibility (reference SDK knobs; one storage design here) ------

    async def install_queue_storage(self, *, schema: str | None = None,
                                    queue_slot_count: int = 16, lease_slot_count: int = 8,
                                    reset: bool = False) -> None:
        """Compatibility: migrate, then enqueue plain jobs into the append-only lane
        (what the reference SDK's queue storage is for: docs/storage.md);
        ``reset=True`` first clears all job data."""
        if self._runtime is not None:
            raise ValidationError("install_queue_storage", "cannot install queue storage while "
                                  "the worker runtime is running")
        await self.prepare_queue_storage_schema(schema=schema, queue_slot_count=queue_slot_count,
                                                lease_slot_count=lease_slot_count)
        if reset:
            pool = await self.pool()
            with translated():
                await pool.execute(self._q["storage_reset"])
        await self.set_ring_enqueue(True)

    async def prepare_queue_storage_schema(self, *, schema: str | None = None,
                                           queue_slot_count: int = 16,
                                           lease_slot_count: int = 8) -> None:
        """Compatibility: validate the reference SDK's storage options, then migrate."""
        if schema is not None and schema != self.schema:
            raise ValidationError("schema", f"this client uses schema {self.schema!r}")
        validate.check_int("queue_slot_count", queue_slot_count, 1, 4096)
        validate.check_int("lease_slot_count", lease_slot_count, 1, 4096)
        await self.migrate()

    async def set_ring_enqueue(self, on: bool) -> None:
        """Enqueue plain jobs into the append-only lane from now on (``on``, the
        default of a database `migrate` installs from nothing), or into awa.jobs. In
        an upgraded database switch it on once every worker runs this release:
        older workers claim only awa.jobs (docs/storage.md, "Switching it on")."""
        if not isinstance(on, bool):
            raise ValidationError("on", "must be a bool")
        pool = await self.pool()
        with translated():
            await pool.execute(self._q["ring_enqueue_set"], on)
        self._lanes = Lanes(self._q)  # this client sees the switch at once
        self._enqueue = self._pipeline()

    async def storage_status(self) -> str:
        """A JSON description of this database's Awa storage."""
        pool = await self.pool()
        with translated():
            row = await pool.fetchrow(self._q["storage_status"])
            async with pool.acquire() as conn:
                version = await migrations.database_version(conn, self.schema)
        assert row is not None
        return json.dumps({
            "engine": "awa-python", "schema": self.schema, "schema_version": version,
            "code_schema_version": migrations.current_migration_version(),
            "active_jobs": row["active_jobs"], "finished_partitions": row["partitions"],
            "finished_jobs_estimate": row["finished_estimate"],
            # Whether plain jobs are enqueued into the append-only lane (migration 0020).
            "ring_enqueue": row["ring_enqueue"],
        })

    @asynccontextmanager
    async def _producer(self) -> AsyncIterator[Conn]:
        """A connection for one enqueue: the client's held one when it is free
        (no pool round trip per insert), else one from the pool."""
        pool = await self.pool()
        if self._producer_lock.locked():
            async with pool.acquire() as borrowed:
                yield borrowed
            return
        async with self._producer_lock:
            held = self._producer_conn
            if held is None or not _usable(held):
                held = self._producer_conn = await pool.acquire()
            try:
                yield held
            except BaseException:
                # A failed statement can leave the held connection unusable (its
                # backend terminated, an operation interrupted) without closing it:
                # hand it back to the pool, which resets or replaces it.
                self._producer_conn = None
                with contextlib.suppress(asyncpg.InterfaceError):  # already taken back
                    await pool.release(held)
                raise
            if not _usable(held):
                self._producer_conn = None
                with contextlib.suppress(asyncpg.InterfaceError):
                    await pool.release(held)

    def _let_go_if_idle(self) -> None:
        """Hand the held producer connection back to the pool unless an insert has
        it: the pool has none left for someone asking (`AwaPool.on_demand`)."""
        held, pool = self._producer_conn, self._pool
        if held is None or pool is None or self._producer_lock.locked():
            return
        self._producer_conn = None
        task = asyncio.get_running_loop().create_task(self._give_back(pool, held))
        self._letting_go.add(task)
        task.add_done_callback(self._letting_go.discard)

    @staticmethod
    async def _give_back(pool: asyncpg.Pool, conn: PoolConnectionProxy) -> None:
        try:
            await pool.release(conn)
        except asyncpg.InterfaceError:  # already taken back
            pass
        except Exception:  # the pool replaces a connection it could not take back
            log.warning("could not hand the producer connection back", exc_info=True)

    # -- enqueue ---------------------------------------------------------------

    async def insert(self, args: Any, **opts: Unpack[EnqueueOptions]) -> InsertedJob:
        """Enqueue one job; `UniqueConflict` if its unique key is taken. The `Job`
        returned can ``await job.wait(timeout)`` for its result (docs/guide/results.md).

        ``after``: jobs (or ids) this one waits for; ``on_parent_failure``: what
        happens to it when one of them fails or is cancelled (docs/guide/workflows.md).
        ``backpressure``: ``"signal"`` or ``Reject(limit)`` (docs/guide/backpressure.md)."""
        return await self._enqueue.insert(args, opts)

    async def enqueue_workflow(self, workflow: Node, *,
                               after: Iterable[Any] | None = None) -> WorkflowRun:
        """Insert a `chain`, `group` or `chord` (nested as you like) in one
        transaction: every job or none. ``after``: existing jobs (or ids) its first
        jobs wait for, each with its own ``on_parent_failure`` (docs/guide/workflows.md)."""
        async with self._producer() as conn:
            return await insert_workflow(conn, self._q, workflow, self._registry.queue_for,
                                         after)

    async def insert_many(self, jobs: Sequence[Any], *, opts: PerJob = None,
                          **defaults: Unpack[EnqueueOptions]) -> list[InsertedJob]:
        """Insert a batch and return its jobs; duplicate unique jobs are skipped.
        Up to 1,000 jobs without ``after`` go as one statement (one round trip,
        one commit); the rest as `insert_many_copy`, whose options it takes."""
        return await self._enqueue.insert_many(jobs, opts, defaults)

    async def insert_many_copy(self, jobs: Sequence[Any], *, opts: PerJob = None,
                               **defaults: Unpack[EnqueueOptions]) -> list[InsertedJob]:
        """Bulk insert through COPY; duplicate unique jobs are skipped. ``after`` and
        ``on_parent_failure`` as on `insert`, for every job (``opts[i]`` may set its own)."""
        return await self._enqueue.insert_many(jobs, opts, defaults, copy=True)

    async def enqueue_many_copy(self, jobs: Sequence[Any], *, opts: PerJob = None,
                                **defaults: Unpack[EnqueueOptions]) -> int:
        """The fastest bulk path (binary COPY); returns how many were inserted. With
        ``after`` (on the call or in ``opts``) the batch takes `insert_many_copy`'s path."""
        return await self._enqueue.count_many(jobs, opts, defaults)

    def paced(self, queue: str, target_depth: int, *, min_sleep: float = 0.01,
              max_sleep: float = 1.0, max_wait: float | None = None) -> Pacer:
        """A producer for bulk loads that keeps ``queue`` near ``target_depth``
        available jobs: ``async with client.paced("q", 10_000) as p: await
        p.enqueue_many(batch)`` (docs/guide/backpressure.md)."""
        return Pacer(queue, target_depth, lambda q, cap: self.queue_depth(q, cap=cap),
                     self.insert, self.insert_many_copy, self.enqueue_many_copy,
                     min_sleep=min_sleep, max_sleep=max_sleep, max_wait=max_wait)

    def transaction(self) -> TransactionStart:
        """``async with client.transaction() as tx`` (or ``await`` it)."""
        async def open_tx() -> Transaction:
            pool = await self.pool()
            conn = await pool.acquire()
            async def release(c: Conn) -> None:
                assert isinstance(c, PoolConnectionProxy)
                await pool.release(c)
            tx = Transaction(conn, self._q, release, router=self._registry.queue_for,
                             waiter=self.wait_for)
            try:
                return await tx._begin()
            except BaseException:
                await pool.release(conn)
                raise
        return TransactionStart(open_tx)

    # -- workers --------------------------------------------------------------------

    def task(self, args_type: Any = None, *, kind: str | None = None,
             queue: str = states.DEFAULT_QUEUE,
             completion: str = "runtime") -> Callable[[Handler], Handler]:
        """Register ``async def handler(job)`` (or a plain ``def``) for a kind: the args
        type's, ``kind``, or a string in place of the type (args arrive as a dict).
        ``completion="caller"``: the handler writes in ``job.transaction`` and the
        job completes in that same transaction (see `awa.owned`)."""
        def register(handler: Handler) -> Handler:
            spec = make_spec(args_type, handler, kind=kind, queue=queue, completion=completion)
            if completion == "caller" and self._followups.has_specs("completed", spec.kind):
                raise ValidationError("completion", f"kind {spec.kind!r} has registered "
                                      "on_completed_enqueue specs; a caller-owned completion "
                                      "inserts its follow-ups in its own transaction")
            self._registry.add(spec)
            return handler
        return register

    def _share_tasks(self, other: AsyncClient) -> None:
        """Route inserts naming no queue by ``other``'s ``@task`` registrations (shared,
        so later ones count too): a producer-only client next to the worker's."""
        self._registry = other._registry
        self._followups = other._followups
        self._enqueue = self._pipeline()

    # -- follow-ups and hooks (docs/guide/follow-ups.md) -------------------------------

    def on_completed_enqueue(self, trigger_type: Any, fn: FollowUpFn) -> None:
        """Insert ``fn(args, job[, context])``'s follow-up atomically with completion."""
        spec = self._registry.get(trigger_kind(trigger_type))
        if spec is not None and spec.completion == "caller":
            raise ValidationError("trigger_type", f"kind {spec.kind!r} completes in the "
                                  "caller's transaction; insert follow-ups there")
        self._followups.add_spec("completed", trigger_type, fn)

    def on_retried_enqueue(self, trigger_type: Any, fn: FollowUpFn) -> None:
        """Follow-up atomically with a retry (handler error, RetryAfter, retry_external)."""
        self._followups.add_spec("retried", trigger_type, fn)

    def on_exhausted_enqueue(self, trigger_type: Any, fn: FollowUpFn) -> None:
        """Follow-up atomically with a terminal failure."""
        self._followups.add_spec("exhausted", trigger_type, fn)

    def on_cancelled_enqueue(self, trigger_type: Any, fn: FollowUpFn) -> None:
        """Follow-up atomically with a handler's Cancel."""
        self._followups.add_spec("cancelled", trigger_type, fn)

    def on_waiting_for_callback_enqueue(self, trigger_type: Any, fn: FollowUpFn) -> None:
        """Follow-up atomically with parking on a callback."""
        self._followups.add_spec("waiting_for_callback", trigger_type, fn)

    def on_rescued_enqueue(self, trigger_type: Any, fn: FollowUpFn) -> None:
        """Follow-up after maintenance rescues a job (best effort, after commit)."""
        self._followups.add_spec("rescued", trigger_type, fn)

    def on_event(self, kind_or_type: Any = None, callback: EventFn | None = None, *,
                 events: Sequence[str] | None = None) -> Any:
        """Observe lifecycle events of one kind (or all with None), after commit.

        Use as ``client.on_event(SendEmail, fn)`` or as a decorator
        ``@client.on_event(SendEmail, events=["completed"])``.
        """
        kind = None
        if isinstance(kind_or_type, str):
            kind = validate.check_name("kind", kind_or_type)
        elif kind_or_type is not None:
            kind = serialize.derive_kind(kind_or_type.__name__)
        if callback is not None:
            self._followups.add_hook(kind, events, callback)
            return callback

        def register(fn: EventFn) -> EventFn:
            self._followups.add_hook(kind, events, fn)
            return fn
        return register

    def periodic(self, name: str, cron_expr: str, args_type: Any, args: Any, *,
                 timezone: str = "UTC", queue: str | None = None,
                 priority: int = states.PRIORITY_DEFAULT,
                 max_attempts: int = states.MAX_ATTEMPTS_DEFAULT,
                 tags: Sequence[str] | None = None, metadata: Mapping[str, Any] | None = None,
                 missed_fire_policy: str = "coalesce", concurrency_key: str | None = None,
                 max_in_flight: int | None = None) -> None:
        """Declare a cron schedule (validated now; upserted when the worker starts).

        With no ``queue``, its jobs go to the queue of the kind's registered task;
        ``concurrency_key``/``max_in_flight`` go on every job it fires, as on insert."""
        self._schedules[name] = CronSchedule.declare(
            name, cron_expr, args_type, args, timezone=timezone, queue=queue,
            priority=priority, max_attempts=max_attempts, tags=tags, metadata=metadata,
            missed_fire_policy=missed_fire_policy, concurrency_key=concurrency_key,
            max_in_flight=max_in_flight)

    def worker(self, args_type: Any = None, *, kind: str | None = None,
               queue: str = states.DEFAULT_QUEUE) -> Callable[[Handler], Handler]:
        """Deprecated spelling of `task` (as in `awa-pg`)."""
        warnings.warn("client.worker() is deprecated, use client.task() instead",
                      DeprecationWarning, stacklevel=2)
        return self.task(args_type, kind=kind, queue=queue)

    async def start(self, queues: Iterable[Any] | None = None, **options: Any) -> None:
        """Start claiming and running jobs in this process (options: `RuntimeConfig`)."""
        if self._runtime is not None:
            raise RuntimeError("this client's worker is already running")
        config = RuntimeConfig.from_start_kwargs(queues, self._registry.queues(), **options)
        check_start(config, self._registry, self._schedules, self._descriptors)
        pool = await self.pool()
        self._runtime = Runtime(pool, self._q, self._registry, config,
                                await self.database_url(), self._followups)
        schedules = {name: s.routed(self._registry.queue_for)
                     for name, s in self._schedules.items()}
        await self._runtime.register(schedules, self._descriptors)
        await self._runtime.start()

    async def shutdown(self, timeout_ms: int = 2000) -> None:
        """Stop claiming, let running handlers finish up to the timeout, abandon the rest."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            await runtime.shutdown(max(0, timeout_ms) / 1000)

    @property
    def runtime(self) -> Runtime | None:
        """The running worker machinery, if `start` was called."""
        return self._runtime

    async def flush_admin_metadata(self) -> None:
        """Compatibility: `queue_stats` reads live counts here, so there is nothing to flush."""
        await self.pool()

    async def health_check(self) -> HealthCheck:
        """Liveness of this process's worker and its database connection."""
        if self._runtime is not None:
            return await self._runtime.health()
        connected = schema_ok = False
        try:
            async with (await self.pool()).acquire() as conn:
                connected = True
                await migrations.check(conn, self.schema)
                schema_ok = True
        except Exception:
            pass
        # No worker here (a web process, say): healthy means the database and schema are.
        return HealthCheck(healthy=schema_ok, postgres_connected=connected,
                           poll_loop_alive=False, heartbeat_alive=False, shutting_down=False,
                           leader=False, runtime="not running", schema_compatible=schema_ok)


def _usable(conn: Conn) -> bool:
    """Whether a held pool connection is still open and still ours (when its socket
    closes, the pool takes it back and the proxy refuses every call)."""
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        return False


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` for a script that runs a worker in its own process: Ctrl-C ends
    it with one line on stderr and exit status 130, instead of a ``CancelledError``
    and ``KeyboardInterrupt`` traceback. ``async with client`` blocks still exit
    (the worker shuts down) before it returns."""
    try:
        return asyncio.run(main)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C): stopped", file=sys.stderr)
        raise SystemExit(130) from None
