"""The worker side of `AwaBackend`: run the project's tasks as Awa jobs.

Awa dispatches a job by its kind, and a Django task's kind is its dotted path,
so the worker finds the task the way Django's reference ``db_worker`` does: it
imports the path when a job arrives (`TaskRegistry`). Only a `Task` object of
this backend runs; a path naming anything else (a plain function, a class),
or nothing, fails the attempt with `NotATask` or the `ImportError`, like any
raising task. At start it also imports every installed app's ``tasks`` module
(and ``OPTIONS["TASK_MODULES"]``) to log what it serves and to fail early on
a broken module; no task needs to be found for the worker to start.

Sync task functions run in the worker's thread pool, async ones on its event
loop; either way Django's ``close_old_connections()`` runs before and after
each job, as Django does around a request, so a connection is never shared
between threads and ``CONN_MAX_AGE`` is honoured.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules

import awa
from awa.cli.shutdown import stop_on_signals
from awa.contrib.django.backend import (
    META_KEY,
    AwaBackend,
    NotATask,
    as_enqueued,
    django_meta,
    import_task,
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
from awa.worker.tasks import Registry, TaskSpec

__all__ = ["TaskRegistry", "build_client", "discover_tasks", "make_handler", "serve"]

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
        meta = django_meta(ctx.metadata)
        if meta.get("backend", backend.alias) != backend.alias:
            raise NotATask(f"job {ctx.id} was enqueued by backend {meta['backend']!r}, not "
                           f"{backend.alias!r}")
        self.task = as_enqueued(task, meta, ctx.queue)
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
        except (TypeError, ValueError) as exc:  # as Django's backends: a TypeError
            raise TypeError(f"the return value of {self.task.module_path} is not JSON "
                            f"serializable: {exc}") from exc
        self._finish(TaskResultStatus.SUCCESSFUL)
        object.__setattr__(self.result, "_return_value", value)
        task_finished.send(AwaBackend, task_result=self.result)
        return Output(value)

    def failed(self, exc: BaseException) -> None:
        """Record the exception's class (for `TaskError`); signal if this was the last try."""
        record_exception(self.ctx, exc)
        if isinstance(exc, TerminalError) or self.ctx.attempt >= self.ctx.max_attempts:
            self._finish(TaskResultStatus.FAILED)
            task_finished.send(AwaBackend, task_result=self.result)

    def _finish(self, status: Any) -> None:
        object.__setattr__(self.result, "status", status)
        object.__setattr__(self.result, "finished_at", timezone.now())


def record_exception(ctx: JobContext, exc: BaseException) -> None:
    """Keep the class of the exception that failed this attempt (for `TaskError`)."""
    path = f"{type(exc).__module__}.{type(exc).__qualname__}"
    current = progress_meta(ctx.progress)
    classes = {**(current.get("errors") or {}), str(ctx.attempt): path}
    ctx.update_metadata({META_KEY: {**current, "errors": classes}})


def _begin(backend: AwaBackend, task: TaskType, ctx: JobContext, worker_id: str) -> _Attempt:
    try:
        return _Attempt(backend, task, ctx, worker_id)
    except Exception as exc:  # the job is not this backend's task's: say why
        record_exception(ctx, exc)
        raise


def make_handler(backend: AwaBackend, task: TaskType,
                 worker_id: Callable[[], str]) -> Callable[[JobContext], Any]:
    """The Awa handler running ``task``: ``async def`` for async task functions."""
    if iscoroutinefunction(task.func):
        async def run_async(ctx: JobContext) -> Output:
            attempt = _begin(backend, task, ctx, worker_id())
            await sync_to_async(close_old_connections)()
            try:
                attempt.started()
                args, kwargs = attempt.call_args()
                value = await attempt.task.func(*args, **kwargs)
                return attempt.succeeded(value)
            except (Exception, SystemExit, KeyboardInterrupt) as exc:
                attempt.failed(exc)
                raise
            finally:
                await sync_to_async(close_old_connections)()
        return run_async

    def run_sync(ctx: JobContext) -> Output:
        attempt = _begin(backend, task, ctx, worker_id())
        close_old_connections()
        try:
            attempt.started()
            args, kwargs = attempt.call_args()
            return attempt.succeeded(attempt.task.func(*args, **kwargs))
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # exit() fails the task too
            attempt.failed(exc)
            raise
        finally:
            close_old_connections()
    return run_sync


class TaskRegistry(Registry):
    """Awa's kind → handler table for a Django backend, filled as jobs arrive: a
    kind is looked up by importing it as a dotted path (`import_task`), and only a
    `Task` of this backend gets a handler running it. Anything else gets a handler
    that fails the attempt with the reason (`ImportError`, `NotATask`), recorded
    as the attempt's exception class. Lookups run on the worker's event loop."""

    def __init__(self, backend: AwaBackend, worker_id: Callable[[], str],
                 queues: Iterable[str]) -> None:
        super().__init__()
        self._backend, self._worker_id = backend, worker_id
        self._queues = list(queues)

    def add_task(self, task: TaskType) -> None:
        """Know ``task`` before its first job arrives."""
        self._add(task.module_path, task)

    def get(self, kind: str) -> TaskSpec | None:
        spec = super().get(kind)
        if spec is not None:
            return spec
        try:
            task = import_task(kind)
            if task.backend != self._backend.alias:
                raise NotATask(f"{kind} is a task of backend {task.backend!r}, not of "
                               f"{self._backend.alias!r}")
        except Exception as exc:  # the module itself may raise anything while importing
            return TaskSpec(kind=kind, queue=self.queue_for(kind), args_type=None,
                            handler=_failing(exc), is_async=False)
        return self._add(kind, task)

    def queues(self) -> list[str]:
        """The queues served: any task may arrive on any of them."""
        return list(self._queues)

    def __len__(self) -> int:
        # Never empty: every importable task of the backend can be run.
        return max(1, super().__len__())

    def _add(self, kind: str, task: TaskType) -> TaskSpec:
        handler = make_handler(self._backend, task, self._worker_id)
        spec = TaskSpec(kind=kind, queue=task.queue_name, args_type=None, handler=handler,
                        is_async=iscoroutinefunction(handler))
        self.add(spec)
        return spec


def _failing(exc: Exception) -> Callable[[JobContext], Any]:
    """A handler failing every attempt with ``exc`` (why the kind cannot run)."""
    def fail(ctx: JobContext) -> None:
        record_exception(ctx, exc)
        raise exc
    return fail


class _Client(awa.AsyncClient):
    """An `AsyncClient` dispatching through a `TaskRegistry`."""

    def __init__(self, backend: AwaBackend, queues: Iterable[str]) -> None:
        super().__init__(backend.worker_database_url(), schema=backend.schema)
        self._registry = TaskRegistry(backend, self._worker_id, queues)

    @property
    def tasks(self) -> TaskRegistry:
        assert isinstance(self._registry, TaskRegistry)
        return self._registry

    def _worker_id(self) -> str:
        runtime = self.runtime
        return runtime.instance_id if runtime is not None else "awa"


def build_client(backend: AwaBackend, tasks: Mapping[str, TaskType],
                 queues: Iterable[str] = ()) -> awa.AsyncClient:
    """An `AsyncClient` on the task database running any task of ``backend`` that
    arrives on ``queues`` (``tasks`` are known up front)."""
    client = _Client(backend, queues)
    for task in tasks.values():
        client.tasks.add_task(task)
    return client


def default_queues(backend: AwaBackend, tasks: Mapping[str, TaskType]) -> list[str]:
    """The queues to serve: the backend's ``QUEUES``, else those of its tasks."""
    if backend.queues:
        return sorted(backend.queues)
    return sorted({t.queue_name for t in tasks.values()}) or ["default"]


async def serve(backend: AwaBackend, queues: Iterable[tuple[str, int]] | None = None, *,
                shutdown_timeout_ms: int = 5000, stop: asyncio.Event | None = None) -> int:
    """Run the backend's tasks until SIGTERM/SIGINT (or ``stop``), then drain: tasks get
    ``shutdown_timeout_ms`` to finish. Returns how many sync tasks were still running
    past it (their threads cannot be stopped; their jobs stay running until rescue).
    A second SIGTERM/SIGINT ends the process at once, as ``awa worker`` does."""
    tasks = await sync_to_async(discover_tasks, thread_sensitive=False)(backend)
    options = dict(backend.worker_options)
    configured = options.pop("queues", None)  # WORKER["queues"]: full queue configs
    if queues is not None:
        queue_list: list[Any] = list(queues)
    elif configured is not None:
        queue_list = list(configured)
    else:
        queue_list = [{"name": n} for n in default_queues(backend, tasks)]
    names = [q["name"] if isinstance(q, Mapping) else q[0] for q in queue_list]
    client = build_client(backend, tasks, names)
    stop = stop or asyncio.Event()
    remove_handlers = stop_on_signals(
        stop, log, "tasks still running are rescued (retried, or FAILED on their last attempt)")
    runtime = None
    try:
        await client.start(queue_list, **options)
        runtime = client.runtime
        log.info("serving %d Django task(s) on queues %s: %s", len(tasks), names,
                 ", ".join(tasks))
        await stop.wait()
        log.info("shutting down")
    finally:
        try:
            await client.shutdown(timeout_ms=shutdown_timeout_ms)
            await client.close()
        finally:
            remove_handlers()
    return runtime.handlers_in_threads() if runtime is not None else 0
