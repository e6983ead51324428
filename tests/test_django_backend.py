"""awa.contrib.django: Awa as Django's task backend, in a real Django project.

The project (tests/django_project: settings, an app with a model and tasks)
talks to the test's own PostgreSQL database through Django's connection;
``python -m django awa_worker`` runs as a subprocess, and results are read
back through Django's task API only.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from tests.helpers import ROOT, SUBPROCESS_PATH

pytest.importorskip("django")
if importlib.util.find_spec("django.tasks") is None:
    pytest.importorskip("django_tasks", reason="needs Django 6 or the django-tasks backport")

SETTINGS = "tests.django_project.settings"
KIND = "tests.django_project.shop.tasks."


def _database(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    return {"NAME": parts.path.lstrip("/"), "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""), "USER": parts.username or "",
            "PASSWORD": parts.password or ""}


@pytest.fixture
def project(database_url: str) -> Iterator[str]:
    """The Django project, pointed at the test's database (its tables migrated)."""
    yield from _project(database_url)


def _project(database_url: str) -> Iterator[str]:
    import django
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections
    from django.test.utils import override_settings

    override = None
    if not settings.configured:
        os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
        django.setup()
    elif "tests.django_project.shop" not in settings.INSTALLED_APPS:
        # Another test module configured Django first: lay this project's apps over it.
        from tests.django_project import settings as project_settings

        override = override_settings(INSTALLED_APPS=project_settings.INSTALLED_APPS,
                                     TASKS=project_settings.TASKS, USE_TZ=True,
                                     ROOT_URLCONF=project_settings.ROOT_URLCONF)
        override.enable()
    connections["default"].close()
    connections.settings["default"].update(_database(database_url))
    call_command("migrate", "shop", verbosity=0)
    try:
        yield database_url
    finally:
        connections.close_all()
        if override is not None:
            override.disable()


def _jobs(url: str) -> list[tuple[Any, ...]]:
    """Every job (kind, queue, priority, args, metadata), read on a separate connection."""
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT kind, queue, priority, args, metadata FROM awa.jobs_all "
                            "ORDER BY id").fetchall()


def _worker(url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": SUBPROCESS_PATH,
           "DJANGO_SETTINGS_MODULE": SETTINGS, "APP_NAME": "awa-django-worker"}
    return subprocess.Popen([sys.executable, "-m", "django", "awa_worker", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"worker ignored SIGTERM; stderr:\n{err}") from None
    return proc.returncode, err


# -- enqueue ---------------------------------------------------------------------------


def test_backend_declares_what_it_supports(project: str) -> None:
    from django.db import connection

    from awa.contrib.django import AwaBackend
    from awa.contrib.django.compat import task_backends

    backend = task_backends["default"]
    assert isinstance(backend, AwaBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task
    assert backend.check() == []
    assert connection.vendor == "postgresql"


def test_enqueue_joins_the_callers_transaction(project: str) -> None:
    from django.db import transaction
    from tests.django_project.shop.models import Note
    from tests.django_project.shop.tasks import add, write_note

    with transaction.atomic():
        Note.objects.create(text="kept")
        kept = write_note.enqueue("kept")
        # Not visible to any other connection before the commit: the same transaction.
        assert _jobs(project) == []
    with transaction.atomic():
        Note.objects.create(text="dropped")
        add.enqueue(1, 2)
        transaction.set_rollback(True)
    outside = add.enqueue(3, 4)  # autocommit: committed at once

    assert list(Note.objects.values_list("text", flat=True)) == ["kept"]
    jobs = _jobs(project)
    assert [(kind, args) for kind, _, _, args, _ in jobs] == [
        (KIND + "write_note", {"args": ["kept"], "kwargs": {}}),
        (KIND + "add", {"args": [3, 4], "kwargs": {}})]
    assert kept.status == "READY" and outside.status == "READY"
    assert kept.id != outside.id and kept.enqueued_at is not None
    assert add.get_result(outside.id).args == [3, 4]


def test_options_map_onto_the_job(project: str) -> None:
    from tests.django_project.shop.tasks import add, send_email, which_attempt

    later = datetime.now(UTC) + timedelta(hours=1)
    send_email.enqueue("a@example.com", subject="hi")
    add.using(priority=-10, run_after=later).enqueue(1, 1)
    add.using(priority=-100, queue_name="emails").enqueue(2, 2)
    which_attempt.enqueue("x")

    jobs = _jobs(project)
    assert [(kind.removeprefix(KIND), queue, prio) for kind, queue, prio, _, _ in jobs] == [
        ("send_email", "emails", 1), ("add", "default", 3), ("add", "emails", 4),
        ("which_attempt", "default", 2)]
    assert jobs[0][3] == {"args": ["a@example.com"], "kwargs": {"subject": "hi"}}
    assert jobs[1][4]["django"] == {"backend": "default", "priority": -10,
                                    "takes_context": False, "run_after": later.isoformat()}
    assert jobs[3][4]["django"]["takes_context"] is True

    deferred = add.get_result(_result_id(project, 1))
    assert deferred.status == "READY"
    assert deferred.task.priority == -10 and deferred.task.run_after == later


def _result_id(url: str, index: int) -> str:
    with psycopg.connect(url) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM awa.jobs_all ORDER BY id")]
    return str(ids[index])


def test_priority_mapping() -> None:
    from awa.contrib.django.backend import awa_priority

    assert [awa_priority(p) for p in (100, 1, 0, -1, -50, -51, -100)] == [1, 1, 2, 3, 3, 4, 4]


def test_what_cannot_map_raises_djangos_errors(project: str) -> None:
    from tests.django_project.shop.tasks import add

    from awa.contrib.django.compat import InvalidTask, TaskResultDoesNotExist

    with pytest.raises(InvalidTask, match="priority"):
        add.using(priority=101)
    with pytest.raises(InvalidTask, match="Queue 'nope'"):
        add.using(queue_name="nope")
    with pytest.raises(InvalidTask, match="aware"):
        add.using(run_after=datetime(2030, 1, 1))
    with pytest.raises(InvalidTask, match="run_at"):
        add.using(run_after=datetime(9999, 12, 31, tzinfo=UTC)).enqueue(1, 2)
    with pytest.raises(TypeError):
        add.enqueue(object(), 2)
    for missing in ("nope", "0", "999999"):
        with pytest.raises(TaskResultDoesNotExist):
            add.get_result(missing)
    assert _jobs(project) == []


def test_get_result_ignores_jobs_that_are_not_django_tasks(project: str) -> None:
    import awa
    from awa.contrib.django.compat import TaskResultDoesNotExist, default_task_backend

    with awa.Client(project) as client:
        plain = client.insert({"x": 1}, kind="plain")
        other = client.insert({"args": [], "kwargs": {}}, kind=KIND + "add",
                              metadata={"django": {"backend": "elsewhere", "priority": 0}})
    for job in (plain, other):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(str(job.id))


def test_separate_database_url(project: str) -> None:
    from tests.django_project.shop.tasks import add

    from awa.contrib.django.backend import AwaBackend

    backend = AwaBackend("other", {"QUEUES": [], "OPTIONS": {"DATABASE_URL": project}})
    result = backend.enqueue(add, [5, 6], {})
    assert _jobs(project)[0][0] == KIND + "add"
    assert backend.get_result(result.id).args == [5, 6]
    assert backend.worker_database_url() == project
    with pytest.raises(Exception, match="not both"):
        AwaBackend("x", {"OPTIONS": {"DATABASE": "default", "DATABASE_URL": project}})
    with pytest.raises(Exception, match="unknown keys"):
        AwaBackend("x", {"OPTIONS": {"DATABASES": "default"}})


def test_database_url_from_settings() -> None:
    from awa.contrib.django.backend import database_url_from_settings

    assert database_url_from_settings(
        {"NAME": "app", "USER": "me", "PASSWORD": "p@ss", "HOST": "db", "PORT": "5433",
         "OPTIONS": {"sslmode": "require"}}) == "postgresql://me:p%40ss@db:5433/app?sslmode=require"
    assert database_url_from_settings({"NAME": "app", "HOST": "/run/pg"}) == \
        "postgresql:///app?host=%2Frun%2Fpg"


def test_worker_finds_the_projects_tasks(project: str) -> None:
    from awa.contrib.django.backend import AwaBackend
    from awa.contrib.django.compat import task_backends
    from awa.contrib.django.worker import default_queues, discover_tasks

    backend = task_backends["default"]
    tasks = discover_tasks(backend)
    # Other test modules may have loaded more tasks (djtasks): those of this app.
    assert sorted(k for k in tasks if k.startswith(KIND)) == [KIND + name for name in (
        "add", "async_multiply", "charge", "send_email", "slow", "which_attempt", "write_note")]
    assert default_queues(backend, tasks) == ["default", "emails"]
    anywhere = AwaBackend("default", {"QUEUES": []})
    assert default_queues(anywhere, tasks) == ["default", "emails"]  # the tasks' own queues


# -- the worker --------------------------------------------------------------------------


def test_awa_worker_runs_tasks_and_results_read_through_django(project: str) -> None:
    from django.db import transaction
    from tests.django_project.shop.models import Note
    from tests.django_project.shop.tasks import (
        add,
        async_multiply,
        charge,
        send_email,
        slow,
        which_attempt,
        write_note,
    )

    from awa.contrib.django.compat import default_task_backend

    with transaction.atomic():
        note = write_note.enqueue("from a task")
    results = {
        "add": add.enqueue(2, 3), "email": send_email.enqueue("b@example.com", subject="s"),
        "async": async_multiply.enqueue(6, 7), "context": which_attempt.enqueue("ctx"),
        "charge": charge.enqueue(10),
        "later": add.using(run_after=datetime.now(UTC) + timedelta(seconds=1)).enqueue(1, 1),
    }
    for _ in range(10):
        write_note.enqueue("many")
    worker = _worker(project, "--queue", "default=4", "--queue", "emails=2")
    try:
        _wait(lambda: all(_refreshed(r).is_finished for r in [note, *results.values()]),
              what="every task to finish")
        # Sync tasks ran in the worker's threads with CONN_MAX_AGE=0: no Django
        # connection of the worker outlives its job.
        _wait(lambda: _worker_connections(project) == 0, what="task connections to close")
        long_running = slow.enqueue(1.0)
        _wait(lambda: _refreshed(long_running).status == "RUNNING", what="slow to start")
        code, stderr = _stop(worker)  # SIGTERM while `slow` runs: it finishes first
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()

    assert code == 0, stderr
    assert "shutting down" in stderr
    assert add.get_result(results["add"].id).return_value == 5
    assert results["email"].return_value == {"to": "b@example.com", "subject": "s"}
    assert results["async"].return_value == 42
    ctx = results["context"].return_value
    assert ctx == {"label": "ctx", "attempt": 1, "id": results["context"].id}
    assert results["later"].return_value == 2
    assert results["later"].started_at >= results["later"].enqueued_at + timedelta(seconds=1)
    assert note.return_value == Note.objects.get(text="from a task").pk
    assert Note.objects.filter(text="many").count() == 10

    failed = results["charge"]
    assert failed.status == "FAILED" and failed.finished_at is not None
    [error] = failed.errors
    assert error.exception_class_path == "tests.django_project.shop.tasks.PaymentDeclined"
    assert error.exception_class.__name__ == "PaymentDeclined"
    assert "card declined for 10" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value

    done = default_task_backend.get_result(long_running.id)
    assert done.status == "SUCCESSFUL" and done.return_value == "done"
    assert done.attempts == 1 and done.worker_ids == ["awa"]
    fetched = asyncio.run(add.aget_result(results["add"].id))
    assert fetched.status == "SUCCESSFUL" and fetched.return_value == 5


def _refreshed(result: Any) -> Any:
    result.refresh()
    return result


def _worker_connections(url: str) -> int:
    """Django connections the worker process holds (its settings name them)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND application_name = 'awa-django-worker'"
                           ).fetchone()
    assert row is not None
    return int(row[0])


def test_missing_task_is_retried_when_retries_are_on(project: str) -> None:
    """A job whose task cannot be imported fails its attempt with the ImportError; with
    attempts left (here 3) it is retried, so a task moved by a deploy is not lost."""
    from tests.django_project.shop.tasks import add

    import awa

    with awa.Client(project) as client:
        job = client.insert({"args": [], "kwargs": {}}, kind=KIND + "gone", max_attempts=3,
                            metadata={"django": {"backend": "default", "priority": 0}})
    _ = add  # the module is importable; the task is not in it
    worker = _worker(project)
    try:
        def retried() -> Any:
            with psycopg.connect(project) as conn:
                row = conn.execute("SELECT state::text, errors FROM awa.jobs_all WHERE id = %s",
                                   [job.id]).fetchone()
            return row if row and row[0] == "retryable" else None
        _state, errors = _wait(retried, what="the unknown kind to be retried")
    finally:
        code, _ = _stop(worker)
    assert code == 0
    assert errors[0]["error"].startswith("ImportError: ")
    assert "does not define a \"gone\"" in errors[0]["error"]


async def test_ui_inside_the_django_asgi_app(database_url: str) -> None:
    """with_awa_ui: the Awa UI below /awa, Django everywhere else; it lists Django tasks."""
    from tests.ui_helpers import call, serving

    def setup() -> Any:
        fixture = _project(database_url)
        next(fixture)
        from django.core.asgi import get_asgi_application
        from tests.django_project.shop.tasks import add

        from awa.contrib.django.asgi import with_awa_ui

        add.enqueue(1, 2)
        return fixture, with_awa_ui(get_asgi_application(), path="/awa")

    django_thread = ThreadPoolExecutor(1)  # Django's connections are per thread
    loop = asyncio.get_running_loop()
    fixture, app = await loop.run_in_executor(django_thread, setup)
    try:
        async with serving(app) as base:
            status, config = await call(f"{base}/awa/api/config")
            assert status == 200 and config["read_only"] is True
            status, jobs = await call(f"{base}/awa/api/jobs")
            assert status == 200, jobs
            assert KIND + "add" in str(jobs)
            assert await asyncio.to_thread(_status, f"{base}/not-awa") == 404  # Django's
    finally:
        await loop.run_in_executor(django_thread, lambda: next(fixture, None))
        django_thread.shutdown()


def _status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
