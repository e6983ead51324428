"""The worker side of `AwaBackend`: find the project's tasks, run them as Awa jobs.

Awa dispatches a job by its kind, and a Django task's kind is its dotted path,
so the worker registers one handler per task it finds: it imports every
installed app's ``tasks`` module (and ``OPTIONS["TASK_MODULES"]``), then takes
every `Task` of this backend reachable from a loaded module. A job whose task
was not found is retried with backoff (Awa's rule for unknown kinds, which a
rolling deploy relies on) with an ``UnknownJobKind`` error naming it.

Sync task functions run in the worker's thread pool, async ones on its event
loop; either way Django's ``close_old_connections()`` runs before and after
each job, as Django does around a request, so a connection is never shared
between threads and ``CONN_MAX_AGE`` is honoured.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules

import awa
from awa.contrib.django.backend import (
    META_KEY,
    AwaBackend,
    as_enqueued,
    django_meta,
    progress_meta,
    task_errors,
    worker_ids,
)
from awa.contrib.django.compat import (
    Task,
    TaskContext,
    TaskResultStatus,
    TaskType,
    normalize_json,
    task_finished,
    task_started,
)
from awa.core.errors import TerminalError
from awa.core.model import Output
from awa.worker.context import JobContext

__all__ = ["build_client", "discover_tasks", "make_handler", "serve"]

log = logging.getLogger("awa.contrib.django")


def discover_tasks(backend: AwaBackend) -> dict[str, TaskType]:
    """Every task of ``backend`` in a loaded module, by dotted path (its Awa kind)."""
    autodiscover_modules("tasks")
    for name in backend.task_modules:
        importlib.import_module(name)
    found: dict[str, TaskType] = {}
    for module in list(sys.modules.values()):
        try:
            namespace = vars(module)
        except TypeError:
            continue
        for value in list(namespace.values()):
            # type(), not isinstance(): a lazy object's __class__ would evaluate it.
            if issubclass(type(value), Task) and value.backend == backend.alias:
                found.setdefault(value.module_path, value)
    return dict(sorted(found.items()))


def _payload(ctx: JobContext) -> tuple[list[Any], dict[str, Any]]:
    data = ctx.args
    if not (isinstance(data, dict) and isinstance(data.get("args", []), list)
            and isinstance(data.get("kwargs", {}), dict)):
        raise TerminalError(f"job {ctx.id}'s args are not a Django task's "
                            "{'args': [...], 'kwargs': {...}}")
    return list(data.get("args", [])), dict(data.get("kwargs", {}))


class _Attempt:
    """One run of a task: the Django `TaskResult` it reports, and its signals."""

    def __init__(self, backend: AwaBackend, task: TaskType, ctx: JobContext,
                 worker_id: str) -> None:
        self.backend, self.ctx = backend, ctx
        self.task = as_enqueued(task, django_meta(ctx.metadata), ctx.queue)
        self.args, self.kwargs = _payload(ctx)
        now = timezone.now()
        self.result = backend._result(
            self.task, ctx.id, TaskResultStatus.RUNNING, {"args": self.args,
                                                          "kwargs": self.kwargs},
            enqueued_at=ctx.created_at_datetime, started_at=now, last_attempted_at=now,
            errors=task_errors(ctx.errors, ctx.progress),
            worker_ids=worker_ids(ctx.attempt, worker_id))

    def call_args(self) -> tuple[list[Any], dict[str, Any]]:
        """Positional and keyword arguments for the task function."""
        if self.task.takes_context:
            return [TaskContext(task_result=self.result), *self.args], self.kwargs
        return self.args, self.kwargs

    def started(self) -> None:
        task_started.send(AwaBackend, task_result=self.result)

    def succeeded(self, value: Any) -> Output:
        """The job's outcome for a returned value (JSON-normalized, as Django does)."""
        try:
            value = normalize_json(value)
        except (TypeError, ValueError) as exc:
            raise TerminalError(f"the return value of {self.task.module_path} is not "
                                f"JSON-serialisable: {exc}") from exc
        self._finish(TaskResultStatus.SUCCESSFUL)
        object.__setattr__(self.result, "_return_value", value)
        task_finished.send(AwaBackend, task_result=self.result)
        return Output(value)

    def failed(self, exc: BaseException) -> None:
        """Record the exception's class (for `TaskError`); signal if this was the last try."""
        path = f"{type(exc).__module__}.{type(exc).__qualname__}"
        current = progress_meta(self.ctx.progress)
        classes = {**(current.get("errors") or {}), str(self.ctx.attempt): path}
        self.ctx.update_metadata({META_KEY: {**current, "errors": classes}})
        if isinstance(exc, TerminalError) or self.ctx.attempt >= self.ctx.max_attempts:
            self._finish(TaskResultStatus.FAILED)
            task_finished.send(AwaBackend, task_result=self.result)

    def _finish(self, status: Any) -> None:
        object.__setattr__(self.result, "status", status)
        object.__setattr__(self.result, "finished_at", timezone.now())


def make_handler(backend: AwaBackend, task: TaskType,
                 worker_id: Callable[[], str]) -> Callable[[JobContext], Any]:
    """The Awa handler running ``task``: ``async def`` for async task functions."""
    if iscoroutinefunction(task.func):
        async def run_async(ctx: JobContext) -> Output:
            attempt = _Attempt(backend, task, ctx, worker_id())
            await sync_to_async(close_old_connections)()
            try:
                attempt.started()
                args, kwargs = attempt.call_args()
                value = await attempt.task.func(*args, **kwargs)
                return attempt.succeeded(value)
            except Exception as exc:
                attempt.failed(exc)
                raise
            finally:
                await sync_to_async(close_old_connections)()
        return run_async

    def run_sync(ctx: JobContext) -> Output:
        attempt = _Attempt(backend, task, ctx, worker_id())
        close_old_connections()
        try:
            attempt.started()
            args, kwargs = attempt.call_args()
            return attempt.succeeded(attempt.task.func(*args, **kwargs))
        except Exception as exc:
            attempt.failed(exc)
            raise
        finally:
            close_old_connections()
    return run_sync


def build_client(backend: AwaBackend, tasks: Mapping[str, TaskType]) -> awa.AsyncClient:
    """An `AsyncClient` on the task database with a handler for each of ``tasks``."""
    client = awa.AsyncClient(backend.worker_database_url(), schema=backend.schema)

    def worker_id() -> str:
        runtime = client.runtime
        return runtime.instance_id if runtime is not None else "awa"

    for path, task in tasks.items():
        client.task(kind=path, queue=task.queue_name)(make_handler(backend, task, worker_id))
    return client


def default_queues(backend: AwaBackend, tasks: Mapping[str, TaskType]) -> list[str]:
    """The queues to serve: the backend's ``QUEUES``, else those of its tasks."""
    if backend.queues:
        return sorted(backend.queues)
    return sorted({t.queue_name for t in tasks.values()}) or ["default"]


async def serve(backend: AwaBackend, queues: Iterable[tuple[str, int]] | None = None, *,
                shutdown_timeout_ms: int = 5000, stop: asyncio.Event | None = None) -> None:
    """Run the backend's tasks until SIGTERM/SIGINT (or ``stop``), then drain and exit."""
    tasks = await sync_to_async(discover_tasks, thread_sensitive=False)(backend)
    client = build_client(backend, tasks)
    options = dict(backend.worker_options)
    configured = options.pop("queues", None)  # WORKER["queues"]: full queue configs
    if queues is not None:
        queue_list: list[Any] = list(queues)
    elif configured is not None:
        queue_list = list(configured)
    else:
        queue_list = [{"name": n} for n in default_queues(backend, tasks)]
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await client.start(queue_list, **options)
        log.info("serving %d Django task(s) on queues %s: %s", len(tasks),
                 [q["name"] if isinstance(q, Mapping) else q[0] for q in queue_list],
                 ", ".join(tasks))
        await stop.wait()
        log.info("shutting down")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await client.shutdown(timeout_ms=shutdown_timeout_ms)
        await client.close()
