"""`AwaBackend`: Django's task backend interface, backed by Awa jobs.

``enqueue()`` inserts the job on Django's own connection (`awa.bridge`), so it
is part of the caller's ``transaction.atomic()`` and rolled back with it.
``get_result()`` reads the job back on the same connection and reports it in
Django's terms. The worker side lives in `awa.contrib.django.worker`.

Mapping (see docs/django.md): the job's kind is the task function's dotted
path; its args are ``{"args": [...], "kwargs": {...}}``; Django's priority
(-100..100, higher first) folds onto Awa's four levels (1 first); the exact
Django priority, backend alias and ``takes_context`` ride in the job's
metadata under ``"django"``.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.module_loading import import_string

from awa.contrib.django.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    TaskType,
    normalize_json,
    task_enqueued,
)
from awa.core import states, validate
from awa.core.errors import AwaError, SchemaNotMigrated, ValidationError
from awa.core.model import Job
from awa.core.states import JobState
from awa.db.queries import queries
from awa.enqueue.bridge import insert_job_sync, to_paramstyle

__all__ = ["AwaBackend", "AwaJobError", "NotATask", "awa_priority", "django_status",
           "import_task"]

#: The key of a Django task's own fields in the job's metadata.
META_KEY = "django"
_OPTIONS = frozenset({"DATABASE", "DATABASE_URL", "SCHEMA", "MAX_ATTEMPTS", "TASK_MODULES",
                      "WORKER"})
#: Attempts per task unless ``OPTIONS["MAX_ATTEMPTS"]`` asks for retries.
MAX_ATTEMPTS_DEFAULT = 1
_SCHEMA_STATES = {"42P01", "3F000", "42704", "42883"}  # undefined table/schema/object/function
_JSON_COLUMNS = ("args", "metadata", "errors", "progress", "output")
_STATUS = {
    JobState.Scheduled: TaskResultStatus.READY,
    JobState.Available: TaskResultStatus.READY,
    JobState.Retryable: TaskResultStatus.READY,
    JobState.Running: TaskResultStatus.RUNNING,
    JobState.WaitingExternal: TaskResultStatus.RUNNING,
    JobState.Completed: TaskResultStatus.SUCCESSFUL,
    JobState.Failed: TaskResultStatus.FAILED,
    JobState.Cancelled: TaskResultStatus.FAILED,
}


class AwaJobError(Exception):
    """An Awa job error with no Python exception behind it (a rescue, a cancel)."""


class NotATask(AwaError, LookupError):
    """A job's kind names something that is not a Django task of the backend: Awa
    runs `Task` objects only, never other callables (the kind is data, not code)."""


def import_task(path: str) -> TaskType:
    """The `Task` object at dotted ``path``: `ImportError` if nothing is there,
    `NotATask` if what is there is not a Django task."""
    found = import_string(path)
    # type(), not isinstance(): a lazy object's __class__ would evaluate it.
    if not issubclass(type(found), Task):
        raise NotATask(f"{path} is not a Django task (Awa runs only objects made by @task, "
                       "never other callables)")
    return found


def schema_missing(exc: BaseException, schema: str, alias: str) -> SchemaNotMigrated | None:
    """The `SchemaNotMigrated` (naming Django's commands) behind a database error, if any."""
    seen: BaseException | None = exc
    while seen is not None:
        state = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if isinstance(seen, SchemaNotMigrated) or state in _SCHEMA_STATES:
            return SchemaNotMigrated(
                f"Awa's schema {schema!r} is missing or out of date in the task database of "
                f"TASKS[{alias!r}]: run `manage.py migrate` (or `manage.py awa_migrate`)")
        seen = seen.__cause__ or seen.__context__
    return None


def awa_priority(priority: int) -> int:
    """Django's priority (-100..100, higher runs first) → Awa's (1..4, 1 runs first)."""
    if priority > 0:
        return 1
    if priority == 0:
        return states.PRIORITY_DEFAULT
    return 3 if priority >= -50 else 4


def django_status(state: JobState) -> Any:
    """The Django `TaskResultStatus` of an Awa job state."""
    return _STATUS[state]


def _exception_path(message: str, known: str | None) -> str:
    """An importable exception class path for an Awa error entry."""
    if known:
        return known
    name = message.split(":", 1)[0].strip()
    found = getattr(builtins, name, None)
    if isinstance(found, type) and issubclass(found, BaseException):
        return f"builtins.{name}"
    return f"{AwaJobError.__module__}.{AwaJobError.__qualname__}"


def task_errors(entries: list[Any], progress: Mapping[str, Any] | None) -> list[Any]:
    """Django `TaskError`s from a job's errors list (and the exception classes the
    worker recorded in its progress metadata)."""
    classes = progress_meta(progress).get("errors") or {}
    out = []
    for entry in entries:
        if isinstance(entry, dict):
            text = str(entry.get("error", ""))
            known = classes.get(str(entry.get("attempt")))
            out.append(TaskError(exception_class_path=_exception_path(text, known),
                                 traceback=text))
    return out


def worker_ids(attempts: int, current: str | None = None) -> list[str]:
    """One entry per attempt started (Awa keeps no per-attempt worker history:
    earlier attempts read ``"awa"``; a running attempt knows its own worker)."""
    ids = ["awa"] * attempts
    if current is not None and ids:
        ids[-1] = current
    return ids


def django_meta(job_metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Django fields stored in a job's metadata (empty for non-Django jobs)."""
    value = (job_metadata or {}).get(META_KEY)
    return value if isinstance(value, dict) else {}


def progress_meta(progress: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the worker recorded about attempts (worker ids, exception classes)."""
    meta = (progress or {}).get("metadata") or {}
    value = meta.get(META_KEY) if isinstance(meta, dict) else None
    return value if isinstance(value, dict) else {}


class AwaBackend(BaseTaskBackend):  # type: ignore[misc]
    """Runs Django tasks as Awa jobs: ``TASKS = {"default": {"BACKEND":
    "awa.contrib.django.AwaBackend", "QUEUES": [...], "OPTIONS": {...}}}``."""

    supports_defer = True  #: run_after → the job's run_at
    supports_priority = True  #: four levels, see `awa_priority`
    supports_get_result = True  #: from any process, on the database
    supports_async_task = True  #: ``async def`` tasks run on the worker's event loop

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(self.options)
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']: unknown keys {unknown} "
                                       f"(known: {sorted(_OPTIONS)})")
        if "DATABASE" in options and "DATABASE_URL" in options:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']: give DATABASE (a Django "
                                       "database alias) or DATABASE_URL, not both")
        self.database: str = options.get("DATABASE", "default")
        self.database_url: str | None = options.get("DATABASE_URL")
        self.schema: str = options.get("SCHEMA", "awa")
        # One attempt, as Django's own backends: a raising task is FAILED at once.
        self.max_attempts: int = options.get("MAX_ATTEMPTS", MAX_ATTEMPTS_DEFAULT)
        self.task_modules: list[str] = list(options.get("TASK_MODULES", []))
        self.worker_options: dict[str, Any] = dict(options.get("WORKER", {}))
        try:
            validate.check_int("MAX_ATTEMPTS", self.max_attempts, states.MAX_ATTEMPTS_MIN,
                               states.MAX_ATTEMPTS_MAX)
            for queue in self.queues:
                validate.check_name("QUEUES", queue)
        except ValidationError as exc:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]: {exc}") from exc
        self._local = threading.local()

    # -- validation -----------------------------------------------------------------

    def validate_task(self, task: TaskType) -> None:
        """Django's checks, then Awa's limits on the kind (dotted path) and queue name."""
        super().validate_task(task)
        try:
            validate.check_name("kind", task.module_path)
            validate.check_name("queue_name", task.queue_name)
        except ValidationError as exc:
            raise InvalidTask(str(exc)) from exc

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django system checks: the task database must be PostgreSQL."""
        if self.database_url is not None:
            return []
        if self.database not in connections.settings:
            return [checks.Error(f"TASKS[{self.alias!r}]: no database {self.database!r} in "
                                 "DATABASES", id="awa.E001")]
        if connections[self.database].vendor != "postgresql":
            return [checks.Error(f"TASKS[{self.alias!r}]: Awa needs a PostgreSQL database; "
                                 f"{self.database!r} is {connections[self.database].vendor}",
                                 id="awa.E002")]
        return []

    # -- enqueue --------------------------------------------------------------------

    def enqueue(self, task: TaskType, args: Any, kwargs: Any) -> Any:
        """Insert the job in the caller's transaction on the task database."""
        self.validate_task(task)
        payload = {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))}
        meta: dict[str, Any] = {"backend": self.alias, "priority": task.priority,
                                "takes_context": task.takes_context}
        if task.run_after is not None:
            meta["run_after"] = task.run_after.isoformat()
        try:
            row = insert_job_sync(self._connection(), payload, schema=self.schema,
                                  kind=task.module_path, queue=task.queue_name,
                                  priority=awa_priority(task.priority),
                                  max_attempts=self.max_attempts, run_at=task.run_after,
                                  metadata={META_KEY: meta})
        except ValidationError as exc:
            raise InvalidTask(str(exc)) from exc
        except AwaError as exc:
            raise (schema_missing(exc, self.schema, self.alias) or exc) from exc
        result = self._result(task, row["id"], TaskResultStatus.READY, payload,
                              enqueued_at=row["created_at"])
        task_enqueued.send(type(self), task_result=result)
        return result

    # -- results --------------------------------------------------------------------

    def get_result(self, result_id: str) -> Any:
        """The task result of job ``result_id``; `TaskResultDoesNotExist` if there is none."""
        try:
            job_id = int(result_id)
            validate.check_id("result_id", job_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        try:
            job = self._read_job(job_id)
        except Exception as exc:
            missing = schema_missing(exc, self.schema, self.alias)
            if missing is None:
                raise
            raise missing from exc
        meta = django_meta(job.metadata) if job is not None else {}
        if job is None or not meta or meta.get("backend", self.alias) != self.alias:
            raise TaskResultDoesNotExist(result_id)
        try:
            return self.result_from_job(job)
        except NotATask as exc:  # the kind names a plain callable: not a task's result
            raise TaskResultDoesNotExist(result_id) from exc

    def result_from_job(self, job: Job) -> Any:
        """A Django `TaskResult` describing an Awa job of a Django task."""
        meta = django_meta(job.metadata)
        task = self.resolve_task(job.kind, meta, queue=job.queue)
        status = django_status(job.state)
        errors = task_errors(job.errors, job.progress)
        args = job.args if isinstance(job.args, dict) else {}
        result = self._result(
            task, job.id, status, args, enqueued_at=job.created_at_datetime,
            started_at=job.attempted_at, last_attempted_at=job.attempted_at,
            finished_at=job.finalized_at_datetime if job.state in states.TERMINAL else None,
            errors=errors, worker_ids=worker_ids(job.attempt))
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", job.output)
        return result

    def resolve_task(self, path: str, meta: Mapping[str, Any], *,
                     queue: str | None = None) -> TaskType:
        """The task at dotted ``path`` as it was enqueued (priority, queue, run_after)."""
        return as_enqueued(import_task(path), meta, queue)

    def _result(self, task: TaskType, job_id: int, status: Any, payload: Mapping[str, Any], *,
                enqueued_at: datetime | None, started_at: datetime | None = None,
                last_attempted_at: datetime | None = None,
                finished_at: datetime | None = None, errors: list[Any] | None = None,
                worker_ids: list[str] | None = None) -> Any:
        return TaskResult(task=task, id=str(job_id), status=status, enqueued_at=enqueued_at,
                          started_at=started_at, last_attempted_at=last_attempted_at,
                          finished_at=finished_at, args=list(payload.get("args") or []),
                          kwargs=dict(payload.get("kwargs") or {}), backend=self.alias,
                          errors=errors or [], worker_ids=worker_ids or [])

    # -- connections ----------------------------------------------------------------

    def _connection(self) -> Any:
        """Django's connection for the task database, or this thread's psycopg one."""
        if self.database_url is None:
            return connections[self.database]
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            import psycopg
            from psycopg.types.string import TextLoader

            conn = psycopg.connect(self.database_url, autocommit=True)
            for name in ("json", "jsonb"):  # read JSON as text, as Django's connections do
                conn.adapters.register_loader(name, TextLoader)
            self._local.conn = conn
        return conn

    def _read_job(self, job_id: int) -> Job | None:
        """Job ``job_id`` read on the task database (any table), or None."""
        sql, params = to_paramstyle(queries(self.schema)["job_get"], (job_id,), "format")
        with self._connection().cursor() as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
            names = [col[0] for col in cur.description]
        if row is None:
            return None
        values = dict(zip(names, row, strict=True))
        for name in _JSON_COLUMNS:
            if isinstance(values.get(name), str):
                values[name] = json.loads(values[name])
        for name, value in values.items():
            if isinstance(value, memoryview):
                values[name] = value.tobytes()
        return Job.from_row(values)

    def worker_database_url(self) -> str:
        """A libpq URL for the worker's own pool: DATABASE_URL, else Django's settings."""
        if self.database_url is not None:
            return self.database_url
        return database_url_from_settings(connections[self.database].settings_dict)


def as_enqueued(task: TaskType, meta: Mapping[str, Any], queue: str | None) -> TaskType:
    """``task`` with the priority, queue and run_after it was enqueued with."""
    changes: dict[str, Any] = {}
    if isinstance(meta.get("priority"), int) and meta["priority"] != task.priority:
        changes["priority"] = meta["priority"]
    if queue is not None and queue != task.queue_name:
        changes["queue_name"] = queue
    if isinstance(meta.get("run_after"), str):
        changes["run_after"] = datetime.fromisoformat(meta["run_after"])
    if isinstance(meta.get("backend"), str) and meta["backend"] != task.backend:
        changes["backend"] = meta["backend"]  # enqueued with .using(backend=...)
    try:
        return dataclasses.replace(task, **changes) if changes else task
    except Exception:  # e.g. a queue or backend no longer configured: as declared
        return task


def database_url_from_settings(settings: Mapping[str, Any]) -> str:
    """A ``postgresql://`` URL from a Django ``DATABASES`` entry."""
    user = quote(str(settings.get("USER") or ""), safe="")
    password = quote(str(settings.get("PASSWORD") or ""), safe="")
    host = str(settings.get("HOST") or "")
    port = str(settings.get("PORT") or "")
    name = quote(str(settings.get("NAME") or ""), safe="")
    query: dict[str, str] = {}
    if host.startswith("/"):  # a Unix socket directory
        query["host"], host = host, ""
    options = settings.get("OPTIONS") or {}
    for key in ("sslmode", "sslrootcert", "sslcert", "sslkey"):
        if options.get(key):
            query[key] = str(options[key])
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    netloc = auth + (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    return f"postgresql://{netloc}/{name}" + (f"?{urlencode(query)}" if query else "")
