"""`Client`: the synchronous face of `AsyncClient`, for Django, Flask and scripts.

It owns a private event loop on a daemon thread; every method submits the
matching `AsyncClient` coroutine there and waits. Nothing is written twice:
methods are generated from the async ones by `_delegate`.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack

from awa.client import AsyncClient
from awa.core.backpressure import QueueDepth
from awa.core.errors import ValidationError
from awa.core.model import Job
from awa.core.options import EnqueueOptions
from awa.core.results import InsertedJob
from awa.enqueue.pacing import Pacer
from awa.enqueue.pipeline import PerJob
from awa.enqueue.transaction import Transaction
from awa.enqueue.workflow import Node, WorkflowRun

P = ParamSpec("P")
R = TypeVar("R")


class LoopThread:
    """An event loop running on a daemon thread, for calling async code from sync."""

    def __init__(self, name: str = "awa-sync") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        """Run ``coro`` on the loop and wait for its result."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("cannot call the sync client from its own event loop")
        future: Future[R] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result()

    def stop(self) -> None:
        """Stop the loop and join the thread."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


def _delegate(method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, R]]
              ) -> Callable[Concatenate[Client, P], R]:
    @functools.wraps(method)
    def call(self: Client, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._loop.run(method(self._async, *args, **kwargs))
    call.__qualname__ = f"Client.{method.__name__}"
    return call  # type: ignore[return-value]


class SyncTransaction:
    """A `Transaction` driven synchronously: ``with client.transaction() as tx``."""

    def __init__(self, loop: LoopThread, tx: Transaction) -> None:
        self._loop = loop
        self._tx = tx

    def execute(self, sql: str, *args: Any) -> int:
        """Run a statement; returns the number of rows it affected."""
        return self._loop.run(self._tx.execute(sql, *args))

    def fetch_one(self, sql: str, *args: Any) -> dict[str, Any]:
        """The first row as a dict; raises `AwaError` if there is none."""
        return self._loop.run(self._tx.fetch_one(sql, *args))

    def fetch_optional(self, sql: str, *args: Any) -> dict[str, Any] | None:
        """The first row as a dict, or None."""
        return self._loop.run(self._tx.fetch_optional(sql, *args))

    def fetch_all(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        """Every row as a dict."""
        return self._loop.run(self._tx.fetch_all(sql, *args))

    def insert(self, args: Any, **opts: Unpack[EnqueueOptions]) -> Job:
        """Enqueue one job inside this transaction (as `Transaction.insert`)."""
        return self._loop.run(self._tx.insert(args, **opts))

    def enqueue_workflow(self, workflow: Node, *,
                         after: Iterable[Any] | None = None) -> WorkflowRun:
        """Insert a `chain`, `group` or `chord` inside this transaction."""
        return self._loop.run(self._tx.enqueue_workflow(workflow, after=after))

    def insert_many(self, jobs: Sequence[Any], *, opts: PerJob = None,
                    **defaults: Unpack[EnqueueOptions]) -> list[InsertedJob]:
        """Enqueue many jobs inside this transaction (as `Transaction.insert_many`)."""
        return self._loop.run(self._tx.insert_many(jobs, opts=opts, **defaults))

    def commit(self) -> None:
        """Commit and release the connection."""
        self._loop.run(self._tx.commit())

    def rollback(self) -> None:
        """Roll back and release the connection."""
        self._loop.run(self._tx.rollback())

    def __enter__(self) -> SyncTransaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._loop.run(self._tx.__aexit__(exc_type, exc, tb))


class SyncPacer:
    """A `Pacer` driven synchronously: ``with client.paced("q", 10_000) as p:``."""

    def __init__(self, loop: LoopThread, pacer: Pacer) -> None:
        self._loop = loop
        self.pacer = pacer  #: the async pacer: ``inserted``, ``paused_seconds``, ``last_depth``

    def wait_for_room(self) -> QueueDepth:
        """Block until the queue holds fewer than ``target_depth`` available jobs."""
        return self._loop.run(self.pacer.wait_for_room())

    def insert(self, args: Any, **opts: Any) -> InsertedJob:
        """`Client.insert` into the paced queue, once there is room."""
        return self._loop.run(self.pacer.insert(args, **opts))

    def insert_many(self, jobs: Sequence[Any], **defaults: Any) -> list[InsertedJob]:
        """`Client.insert_many_copy` into the paced queue, once there is room."""
        return self._loop.run(self.pacer.insert_many(jobs, **defaults))

    def enqueue_many(self, jobs: Sequence[Any], **defaults: Any) -> int:
        """`Client.enqueue_many_copy` into the paced queue, once there is room."""
        return self._loop.run(self.pacer.enqueue_many(jobs, **defaults))

    def __enter__(self) -> SyncPacer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


class Client:
    """Synchronous client with the enqueue, admin, DLQ and callback methods.

    ``tasks``: the `AsyncClient` whose ``@task`` registrations your workers run.
    An insert naming no queue then goes to the queue its kind's task serves (as
    on that client; registrations made later count too), rather than to
    ``"default"``: ``awa.Client(tasks=worker.client).insert(SendEmail(...))``.
    """

    def __init__(self, database_url: str | None = None, max_connections: int = 10, *,
                 schema: str = "awa", command_timeout: float | None = None,
                 tasks: AsyncClient | None = None) -> None:
        if tasks is not None and not isinstance(tasks, AsyncClient):
            raise ValidationError("tasks", "must be an awa.AsyncClient (the one whose @task "
                                           f"registrations route inserts), got "
                                           f"{type(tasks).__name__}")
        self._loop = LoopThread()
        self._async = self._loop.run(_make_async(database_url, max_connections, schema,
                                                 command_timeout))
        if tasks is not None:
            self._async._share_tasks(tasks)

    def close(self) -> None:
        """Close the pool and stop the private event loop."""
        try:
            self._loop.run(self._async.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def transaction(self) -> SyncTransaction:
        """``with client.transaction() as tx:`` commits on clean exit."""
        async def open_tx() -> Transaction:
            return await self._async.transaction()
        return SyncTransaction(self._loop, self._loop.run(open_tx()))

    def insert(self, args: Any, **opts: Unpack[EnqueueOptions]) -> InsertedJob:
        """Enqueue one job (`AsyncClient.insert`); ``job.wait_sync(timeout)`` waits for it."""
        job = self._loop.run(self._async.insert(args, **opts))
        return InsertedJob.attach(job, sync_waiter=self.wait_for, depth=job.queue_depth)

    def insert_many(self, jobs: Sequence[Any], *, opts: PerJob = None,
                    **defaults: Unpack[EnqueueOptions]) -> list[InsertedJob]:
        """Insert a batch, up to 1,000 jobs in one statement (`AsyncClient.insert_many`)."""
        return self._waitable(self._loop.run(self._async.insert_many(jobs, opts=opts,
                                                                     **defaults)))

    def insert_many_copy(self, jobs: Sequence[Any], *, opts: PerJob = None,
                         **defaults: Unpack[EnqueueOptions]) -> list[InsertedJob]:
        """Bulk insert through COPY (`AsyncClient.insert_many_copy`)."""
        return self._waitable(self._loop.run(self._async.insert_many_copy(jobs, opts=opts,
                                                                          **defaults)))

    def _waitable(self, inserted: list[InsertedJob]) -> list[InsertedJob]:
        """The async client's jobs, made to wait with this client (``job.wait_sync``)."""
        return [InsertedJob.attach(j, sync_waiter=self.wait_for, depth=j.queue_depth)
                for j in inserted]

    def paced(self, queue: str, target_depth: int, *, min_sleep: float = 0.01,
              max_sleep: float = 1.0, max_wait: float | None = None) -> SyncPacer:
        """`AsyncClient.paced`, blocking (its jobs wait with ``wait_for``, not ``wait_sync``)."""
        return SyncPacer(self._loop, self._async.paced(
            queue, target_depth, min_sleep=min_sleep, max_sleep=max_sleep, max_wait=max_wait))

    @property
    def queue_depths(self) -> Mapping[str, QueueDepth]:
        """The depth last measured per queue (`AsyncClient.queue_depths`)."""
        return self._async.queue_depths

    migrate = _delegate(AsyncClient.migrate)
    check_schema = _delegate(AsyncClient.check_schema)
    wait_for = _delegate(AsyncClient.wait_for)
    #: The same blocking wait, under the name the async client uses for it.
    wait_for_sync = wait_for
    queue_depth = _delegate(AsyncClient.queue_depth)
    enqueue_workflow = _delegate(AsyncClient.enqueue_workflow)
    enqueue_many_copy = _delegate(AsyncClient.enqueue_many_copy)
    get_job = _delegate(AsyncClient.get_job)
    workflow = _delegate(AsyncClient.workflow)
    list_jobs = _delegate(AsyncClient.list_jobs)
    dump_job = _delegate(AsyncClient.dump_job)
    cancel = _delegate(AsyncClient.cancel)
    cancel_by_unique_key = _delegate(AsyncClient.cancel_by_unique_key)
    retry = _delegate(AsyncClient.retry)
    pause_queue = _delegate(AsyncClient.pause_queue)
    resume_queue = _delegate(AsyncClient.resume_queue)
    drain_queue = _delegate(AsyncClient.drain_queue)
    queue_stats = _delegate(AsyncClient.queue_stats)
    concurrency_keys = _delegate(AsyncClient.concurrency_keys)
    flush_admin_metadata = _delegate(AsyncClient.flush_admin_metadata)
    health_check = _delegate(AsyncClient.health_check)
    install_queue_storage = _delegate(AsyncClient.install_queue_storage)
    complete_external = _delegate(AsyncClient.complete_external)
    fail_external = _delegate(AsyncClient.fail_external)
    retry_external = _delegate(AsyncClient.retry_external)
    resume_external = _delegate(AsyncClient.resume_external)
    heartbeat_callback = _delegate(AsyncClient.heartbeat_callback)
    resolve_callback = _delegate(AsyncClient.resolve_callback)
    retry_failed = _delegate(AsyncClient.retry_failed)
    discard_failed = _delegate(AsyncClient.discard_failed)
    dump_run = _delegate(AsyncClient.dump_run)
    list_dlq = _delegate(AsyncClient.list_dlq)
    get_dlq_job = _delegate(AsyncClient.get_dlq_job)
    dlq_depth = _delegate(AsyncClient.dlq_depth)
    dlq_depth_by_queue = _delegate(AsyncClient.dlq_depth_by_queue)
    retry_from_dlq = _delegate(AsyncClient.retry_from_dlq)
    bulk_retry_from_dlq = _delegate(AsyncClient.bulk_retry_from_dlq)
    move_failed_to_dlq = _delegate(AsyncClient.move_failed_to_dlq)
    bulk_move_failed_to_dlq = _delegate(AsyncClient.bulk_move_failed_to_dlq)
    purge_dlq_job = _delegate(AsyncClient.purge_dlq_job)
    purge_dlq = _delegate(AsyncClient.purge_dlq)
    list_cron_jobs = _delegate(AsyncClient.list_cron_jobs)
    delete_cron_job = _delegate(AsyncClient.delete_cron_job)
    pause_cron_job = _delegate(AsyncClient.pause_cron_job)
    resume_cron_job = _delegate(AsyncClient.resume_cron_job)
    trigger_cron_job = _delegate(AsyncClient.trigger_cron_job)
    storage_status = _delegate(AsyncClient.storage_status)
    set_ring_enqueue = _delegate(AsyncClient.set_ring_enqueue)
    set_queue_override = _delegate(AsyncClient.set_queue_override)
    queue_overrides = _delegate(AsyncClient.queue_overrides)
    clear_queue_override = _delegate(AsyncClient.clear_queue_override)
    list_descriptors = _delegate(AsyncClient.list_descriptors)
    preview_batch_operation = _delegate(AsyncClient.preview_batch_operation)
    submit_batch_operation = _delegate(AsyncClient.submit_batch_operation)
    preview_set_priority = _delegate(AsyncClient.preview_set_priority)
    set_priority = _delegate(AsyncClient.set_priority)
    preview_move_queue = _delegate(AsyncClient.preview_move_queue)
    move_queue = _delegate(AsyncClient.move_queue)
    list_batch_operations = _delegate(AsyncClient.list_batch_operations)
    get_batch_operation = _delegate(AsyncClient.get_batch_operation)
    cancel_batch_operation = _delegate(AsyncClient.cancel_batch_operation)
    purge_batch_operations = _delegate(AsyncClient.purge_batch_operations)


async def _make_async(database_url: str | None, max_connections: int, schema: str,
                      command_timeout: float | None) -> AsyncClient:
    # Built on the loop thread so its asyncio primitives belong to that loop.
    return AsyncClient(database_url, max_connections, schema=schema,
                       command_timeout=command_timeout)
