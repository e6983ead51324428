"""Django's task-backend contract, checked against `AwaBackend` and ``awa_worker``.

Written for Awa after reading the behaviours that the ``django-tasks`` backport's
backend suites (its database and immediate backends, before the database backend
moved to ``django-tasks-db``) and Django's ``tests/tasks/`` check: what a Django
team switching from the reference database backend relies on. Results are read
through Django's task API only; the worker is a real ``python -m django
awa_worker`` subprocess. Its tasks live in ``tests.django_project.djtasks``,
a module no app's ``tasks`` autodiscovery and no ``TASK_MODULES`` name (the
worker's settings, ``settings_bare``, install no app with tasks at all).

Where Awa differs on purpose, docs/django.md lists it ("Differences from
Django's reference backends").
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from tests.helpers import ROOT, SUBPROCESS_PATH
from tests.test_django_backend import _project, _wait

pytest.importorskip("django")
if importlib.util.find_spec("django.tasks") is None:
    pytest.importorskip("django_tasks", reason="needs Django 6 or the django-tasks backport")

BARE = "tests.django_project.settings_bare"
MOD = "tests.django_project.djtasks."


@pytest.fixture
def project(database_url: str) -> Iterator[str]:
    yield from _project(database_url)


@contextlib.contextmanager
def django_on(url: str) -> Iterator[None]:
    """The project pointed at ``url`` (e.g. a database with no Awa schema)."""
    fixture = _project(url)
    next(fixture)
    try:
        yield
    finally:
        next(fixture, None)


class Worker:
    """``python -m django awa_worker`` with the bare settings (no app has tasks)."""

    def __init__(self, url: str, *args: str, settings: str = BARE,
                 env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": SUBPROCESS_PATH,
               "DJANGO_SETTINGS_MODULE": settings, "APP_NAME": "awa-django-contract",
               **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "django", "awa_worker", *args],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> tuple[int, str]:
        """Exit code and stderr; kills the worker if it does not exit in ``timeout``."""
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("awa_worker did not exit") from None
        return self.proc.returncode, err

    def stop(self) -> tuple[int, str]:
        self.signal(signal.SIGTERM)
        return self.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()

    def alive(self) -> bool:
        return self.proc.poll() is None


@pytest.fixture
def worker_factory(project: str) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(*args: str, settings: str = BARE, env: dict[str, str] | None = None) -> Worker:
        worker = Worker(project, *args, settings=settings, env=env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    return _wait(predicate, timeout, what)


def finished(*results: Any) -> Callable[[], bool]:
    def check() -> bool:
        for result in results:
            result.refresh()
        return all(r.is_finished for r in results)
    return check


def status_is(result: Any, status: str) -> Callable[[], bool]:
    def check() -> bool:
        result.refresh()
        return bool(result.status == status)
    return check


def djtasks() -> Any:
    from tests.django_project import djtasks as module

    return module


def insert_raw(url: str, kind: str, *, backend: str = "default") -> str:
    """A job as a Django task's would look, for a kind that is not necessarily a task."""
    import awa

    with awa.Client(url) as client:
        job = client.insert({"args": [], "kwargs": {}}, kind=kind, max_attempts=1,
                            metadata={"django": {"backend": backend, "priority": 0}})
    return str(job.id)


def job_row(url: str, result_id: str) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT state::text, max_attempts, errors FROM awa.jobs_all "
                           "WHERE id = %s", [int(result_id)]).fetchone()
    assert row is not None
    return tuple(row)


# -- enqueue and results, no worker ---------------------------------------------------


def test_enqueued_result_describes_a_ready_task(project: str) -> None:
    from awa.contrib.django.compat import TaskResultStatus

    t = djtasks()
    result = t.add.enqueue(1, b=2)
    assert result.status == TaskResultStatus.READY
    assert isinstance(result.id, str) and result.id
    assert result.enqueued_at is not None
    assert result.started_at is None and result.last_attempted_at is None
    assert result.finished_at is None
    assert result.errors == [] and result.worker_ids == [] and result.attempts == 0
    assert result.args == [1] and result.kwargs == {"b": 2}
    assert result.backend == "default"
    assert result.task.func is t.add.func and result.task.module_path == MOD + "add"
    assert not result.is_finished
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value


def test_aenqueue(project: str) -> None:
    from asgiref.sync import async_to_sync

    result = async_to_sync(djtasks().add.aenqueue)(3, 4)
    assert result.status == "READY" and result.args == [3, 4]
    assert djtasks().add.get_result(result.id).id == result.id


def test_get_result_reads_back_the_same_task(project: str) -> None:
    from awa.contrib.django.compat import default_task_backend

    t = djtasks()
    result = t.add.using(priority=7, queue_name="emails").enqueue(5, 6)
    for fetched in (default_task_backend.get_result(result.id), t.add.get_result(result.id)):
        assert fetched.id == result.id and fetched.status == result.status
        assert fetched.args == [5, 6] and fetched.kwargs == {}
        assert fetched.enqueued_at == result.enqueued_at
        assert fetched.task.priority == 7 and fetched.task.queue_name == "emails"
        assert fetched.task.func is t.add.func


def test_aget_result(project: str) -> None:
    from asgiref.sync import async_to_sync

    from awa.contrib.django.compat import TaskResultDoesNotExist, default_task_backend

    result = djtasks().add.enqueue(1, 1)
    fetched = async_to_sync(default_task_backend.aget_result)(result.id)
    assert fetched.id == result.id and fetched.status == "READY"
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)("123456789")


@pytest.mark.parametrize("missing", ["123456789", "not-an-id", "-1", "0",
                                     "123e4567-e89b-12d3-a456-426614174000", "1" * 40, ""])
def test_get_missing_result(project: str, missing: str) -> None:
    from awa.contrib.django.compat import TaskResultDoesNotExist, default_task_backend

    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(missing)


def test_refresh_of_a_waiting_task_changes_nothing(project: str) -> None:
    import dataclasses

    from asgiref.sync import async_to_sync

    result = djtasks().add.using(priority=-3).enqueue(1, b=2)
    before = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == before
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == before


def test_get_result_through_another_task_is_a_mismatch(project: str) -> None:
    t = djtasks()
    result = t.add.enqueue(1, 2)
    with pytest.raises(Exception, match="Task does not match") as raised:
        t.noop.get_result(result.id)
    assert type(raised.value).__name__ in ("TaskResultMismatch", "TaskResultMismatchError")


def test_enqueue_is_visible_inside_the_open_transaction(project: str) -> None:
    """Enqueue does not wait for the commit: the result exists in the transaction."""
    from django.db import transaction

    from awa.contrib.django.compat import TaskResultDoesNotExist

    t = djtasks()
    with transaction.atomic():
        result = t.add.enqueue(1, 2)
        assert t.add.get_result(result.id).status == "READY"
        transaction.set_rollback(True)
    with pytest.raises(TaskResultDoesNotExist):
        t.add.get_result(result.id)


def test_enqueue_sends_task_enqueued(project: str) -> None:
    from awa.contrib.django.compat import task_enqueued

    seen: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(task_result)

    task_enqueued.connect(receiver)
    try:
        result = djtasks().noop.enqueue()
    finally:
        task_enqueued.disconnect(receiver)
    assert [r.id for r in seen] == [result.id]


def test_enqueue_is_logged(project: str, caplog: pytest.LogCaptureFixture) -> None:
    """Django's own signal receivers log the enqueue (debug level)."""
    import logging

    from awa.contrib.django.compat import SOURCE

    with caplog.at_level(logging.DEBUG, logger=SOURCE):
        result = djtasks().noop.enqueue()
    assert f"Task id={result.id} path={MOD}noop enqueued backend=default" in caplog.text


def test_arguments_must_be_json(project: str) -> None:
    t = djtasks()
    for bad in (object(), {1, 2}, datetime.now(UTC)):
        with pytest.raises(TypeError):
            t.add.enqueue(bad, 1)
    with pytest.raises(TypeError):
        t.add.enqueue(1, b=object())
    # Tuples are JSON arrays, as Django normalizes them.
    assert t.add.enqueue((1, 2), [3]).args == [[1, 2], [3]]


def test_task_options_are_validated(project: str) -> None:
    from awa.contrib.django.compat import InvalidTask

    t = djtasks()
    for priority in (-101, 101):
        with pytest.raises(InvalidTask):
            t.add.using(priority=priority)
    with pytest.raises(InvalidTask):
        t.add.using(queue_name="not-configured")
    with pytest.raises(InvalidTask):
        t.add.using(run_after=datetime(2030, 1, 1))  # naive, with USE_TZ
    later = datetime.now(UTC) + timedelta(days=1)
    task = t.add.using(priority=-20, run_after=later)
    assert task.priority == -20 and task.run_after == later
    assert t.add.priority == 0 and t.add.run_after is None  # the original is unchanged


def test_only_module_level_functions_are_tasks(project: str) -> None:
    from awa.contrib.django.compat import InvalidTask, task

    def inner() -> None:
        return None

    with pytest.raises(InvalidTask):
        task(inner)


def test_calling_the_task_runs_it_in_process(project: str) -> None:
    from asgiref.sync import async_to_sync

    t = djtasks()
    assert t.add.call(2, 3) == 5
    assert async_to_sync(t.async_add.acall)(2, 3) == 5
    assert _job_count(project) == 0


def _job_count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM awa.jobs_all").fetchone()
    assert row is not None
    return int(row[0])


def test_default_is_one_attempt(project: str) -> None:
    from awa.contrib.django.backend import AwaBackend

    result = djtasks().add.enqueue(1, 2)
    assert job_row(project, result.id)[1] == 1
    retrying = AwaBackend("default", {"QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 3}})
    again = retrying.enqueue(djtasks().add, [1, 2], {})
    assert job_row(project, again.id)[1] == 3


def test_get_result_refuses_a_job_naming_a_plain_callable(project: str) -> None:
    from awa.contrib.django.compat import TaskResultDoesNotExist, default_task_backend

    for kind in ("subprocess.check_output", MOD + "plain_function", MOD + "not_callable",
                 "os.system"):
        result_id = insert_raw(project, kind)
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)


def test_get_result_of_a_task_that_no_longer_imports(project: str) -> None:
    from awa.contrib.django.compat import default_task_backend

    for kind in (MOD + "no_such_task", "tests.django_project.no_such_module.task"):
        result_id = insert_raw(project, kind)
        with pytest.raises(ImportError):
            default_task_backend.get_result(result_id)


def test_get_result_refuses_another_backends_job(project: str) -> None:
    from awa.contrib.django.compat import TaskResultDoesNotExist, default_task_backend

    result_id = insert_raw(project, MOD + "add", backend="another")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)


def test_backend_features_and_check(project: str) -> None:
    from awa.contrib.django.compat import default_task_backend

    assert default_task_backend.supports_defer
    assert default_task_backend.supports_async_task
    assert default_task_backend.supports_get_result
    assert default_task_backend.supports_priority
    assert list(default_task_backend.check()) == []


def test_manage_py_check_reports_a_database_that_is_not_postgresql(tmp_path: Any) -> None:
    """Even without "django_tasks" in INSTALLED_APPS (the backport only runs backend
    checks from its app)."""
    settings = tmp_path / "lite_settings.py"
    settings.write_text(
        "from tests.django_project.settings import *  # noqa\n"
        "INSTALLED_APPS = ['awa.contrib.django']\n"
        f"DATABASES = {{**DATABASES, 'lite': {{'ENGINE': 'django.db.backends.sqlite3', "
        f"'NAME': {str(tmp_path / 'lite.db')!r}}}}}\n"
        "TASKS = {'default': {'BACKEND': 'awa.contrib.django.AwaBackend', "
        "'OPTIONS': {'DATABASE': 'lite'}}}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), SUBPROCESS_PATH]),
           "DJANGO_SETTINGS_MODULE": "lite_settings"}
    proc = subprocess.run([sys.executable, "-m", "django", "check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "awa.E002" in proc.stderr and "PostgreSQL" in proc.stderr


def test_missing_schema_names_djangos_commands(empty_database_url: str) -> None:
    from awa.contrib.django.compat import default_task_backend
    from awa.core.errors import SchemaNotMigrated

    with django_on(empty_database_url):
        with pytest.raises(SchemaNotMigrated, match=r"manage\.py migrate") as raised:
            djtasks().add.enqueue(1, 2)
        assert "awa migrate`" not in str(raised.value)
        with pytest.raises(SchemaNotMigrated, match=r"manage\.py migrate"):
            default_task_backend.get_result("1")


def test_manage_py_migrate_creates_awas_schema(empty_database_url: str) -> None:
    from django.core.management import call_command

    from awa.db.migrations import current_migration_version

    with django_on(empty_database_url):
        call_command("migrate", verbosity=0)
        result = djtasks().add.enqueue(1, 2)
        assert djtasks().add.get_result(result.id).status == "READY"
        call_command("migrate", verbosity=0)  # nothing left to do
        with psycopg.connect(empty_database_url) as conn:
            row = conn.execute("SELECT max(version) FROM awa.schema_migrations").fetchone()
            applied = conn.execute("SELECT name FROM django_migrations WHERE app = 'awa' "
                                   "ORDER BY id").fetchall()
        assert row is not None and row[0] == current_migration_version()
        assert applied == [("0001_awa_schema",), ("0002_awa_ring",), ("0003_awa_throughput",),
                           ("0004_awa_claim_and_reclaim",), ("0005_awa_ring_turns",),
                           ("0006_awa_leaner_ring",), ("0007_awa_reclaim_beside_readers",),
                           ("0008_awa_history_by_name",), ("0009_awa_presence_append_only",),
                           ("0010_awa_reclaim_by_counts",), ("0011_awa_upkeep_reads_less",),
                           ("0012_awa_reclaim_counts_once",), ("0013_awa_just_left_receipts_wait",),
                           ("0014_awa_ring_slot_planned_once",)]


def test_awa_migrate_still_creates_the_schema_apart(empty_database_url: str) -> None:
    from io import StringIO

    from django.core.management import call_command

    with django_on(empty_database_url):
        first, again = StringIO(), StringIO()
        call_command("awa_migrate", stdout=first)
        call_command("awa_migrate", stdout=again)
        assert first.getvalue().startswith("applied migrations [1, ")
        assert again.getvalue().strip() == "Awa schema is up to date"
        assert djtasks().add.enqueue(1, 2).status == "READY"


def test_worker_on_a_database_without_the_schema_says_what_to_run(
        empty_database_url: str) -> None:
    worker = Worker(empty_database_url)
    code, stderr = worker.wait()
    assert code == 1
    assert "manage.py migrate" in stderr and "awa_migrate" in stderr


def test_the_django_migrations_bring_the_latest_awa_schema() -> None:
    """A release that adds an Awa migration adds a Django migration running it."""
    import pkgutil

    from awa.contrib.django import migrations as package
    from awa.db.migrations import current_migration_version

    versions = [importlib.import_module(f"{package.__name__}.{m.name}").AWA_SCHEMA_VERSION
                for m in pkgutil.iter_modules(package.__path__)]
    assert max(versions) == current_migration_version()


# -- the worker ------------------------------------------------------------------------


def test_worker_starts_with_no_task_found_and_runs_any_importable_task(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    t = djtasks()
    results = [t.add.enqueue(2, 3), t.async_add.enqueue(4, 5), t.noop.enqueue(),
               t.add.using(queue_name="emails", priority=10).enqueue(1, 1)]
    worker = worker_factory()
    wait_for(finished(*results), "every task to finish")
    code, stderr = worker.stop()
    assert code == 0, stderr
    assert "serving 0 Django task(s)" in stderr
    assert [r.status for r in results] == ["SUCCESSFUL"] * 4
    assert [r.return_value for r in results] == [5, 9, None, 2]
    for r in results:
        assert r.enqueued_at <= r.started_at <= r.finished_at
        assert r.last_attempted_at == r.started_at
        assert r.attempts == 1 and len(r.worker_ids) == 1 and r.errors == []


def test_worker_logs_each_task_through_djangos_signals(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    t = djtasks()
    ok, bad = t.noop.enqueue(), t.fails_value_error.enqueue()
    worker = worker_factory()
    wait_for(finished(ok, bad), "both tasks")
    code, stderr = worker.stop()
    assert code == 0
    assert f"Task id={ok.id} path={MOD}noop state=RUNNING" in stderr
    assert f"Task id={ok.id} path={MOD}noop state=SUCCESSFUL" in stderr
    assert f"Task id={bad.id} path={MOD}fails_value_error state=FAILED" in stderr
    assert "ValueError: this task failed with a ValueError" in stderr


def test_failing_task_is_failed_with_its_exception(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    result = djtasks().fails_value_error.enqueue()
    worker_factory()
    wait_for(finished(result), "the task to fail")
    assert result.status == "FAILED"
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    [error] = result.errors
    assert error.exception_class is ValueError
    assert error.exception_class_path == "builtins.ValueError"
    assert error.traceback.startswith("ValueError: this task failed with a ValueError")
    assert "fails_value_error" in error.traceback  # the task's own frame
    assert job_row(project, result.id)[0] == "failed"


def test_exception_classes_and_text_are_kept(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    t = djtasks()
    own = t.fails_own_error.enqueue("card declined")
    nested = t.fails_nested_exception.enqueue()
    worker_factory()
    wait_for(finished(own, nested), "both tasks to fail")
    assert own.status == nested.status == "FAILED"
    assert own.errors[0].exception_class is t.Rejected
    assert own.errors[0].exception_class_path == MOD + "Rejected"
    assert "card declined" in own.errors[0].traceback
    assert nested.errors[0].exception_class is ValueError
    assert "the inner failure" in nested.errors[0].traceback


def test_return_value_is_json_or_a_type_error(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    t = djtasks()
    bad = t.returns_non_json.enqueue()
    tuples = t.returns_tuple.enqueue()
    worker_factory()
    wait_for(finished(bad, tuples), "both tasks to finish")
    assert bad.status == "FAILED" and bad.finished_at is not None
    assert bad._return_value is None
    assert bad.errors[0].exception_class is TypeError
    assert "is not JSON serializable" in bad.errors[0].traceback
    assert tuples.status == "SUCCESSFUL"
    assert tuples.return_value == {"pair": [1, 2], "nested": [[3, {"k": [4]}]]}


def test_jobs_naming_anything_but_a_task_fail_without_running_it(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    from awa.contrib.django.compat import default_task_backend

    refused = {kind: insert_raw(project, kind) for kind in (
        "subprocess.check_output", MOD + "plain_function", MOD + "not_callable")}
    missing = {kind: insert_raw(project, kind) for kind in (
        MOD + "no_such_task", "tests.django_project.no_such_module.task", "not_a_path")}
    ok = djtasks().add.enqueue(1, 2)
    worker_factory()
    wait_for(finished(ok), "the real task to run")
    for result_id in [*refused.values(), *missing.values()]:
        wait_for(lambda rid=result_id: job_row(project, rid)[0] == "failed", "a refusal")
    for kind, result_id in refused.items():
        error = job_row(project, result_id)[2][-1]["error"]
        assert error.startswith("NotATask: ") and kind in error
    for result_id in missing.values():  # ImportError or its ModuleNotFoundError
        assert job_row(project, result_id)[2][-1]["error"].split(":")[0] in (
            "ImportError", "ModuleNotFoundError")
    assert ok.return_value == 3
    assert default_task_backend.get_result(ok.id).return_value == 3


def test_task_of_another_backend_is_not_run(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    """A job enqueued by another backend alias is not run by this backend's worker."""
    result_id = insert_raw(project, MOD + "add", backend="elsewhere")
    ok = djtasks().noop.enqueue()
    worker_factory()
    wait_for(finished(ok), "the real task to run")
    wait_for(lambda: job_row(project, result_id)[0] == "failed", "the foreign job to fail")
    error = job_row(project, result_id)[2][-1]["error"]
    assert error.startswith("NotATask: ") and "'elsewhere'" in error


def test_context_reaches_the_task(project: str, worker_factory: Callable[..., Worker]) -> None:
    t = djtasks()
    own = t.own_id.enqueue()
    described = t.describe_context.enqueue(7)
    worker_factory()
    wait_for(finished(own, described), "the context tasks")
    assert own.return_value == own.id
    assert described.return_value == {"n": 7, "attempt": 1, "status": "RUNNING",
                                      "started": True, "args": [7], "task": "describe_context"}


def test_run_after_is_honoured(project: str, worker_factory: Callable[..., Worker]) -> None:
    t = djtasks()
    soon = datetime.now(UTC) + timedelta(seconds=1)
    later = t.add.using(run_after=datetime.now(UTC) + timedelta(hours=1)).enqueue(1, 1)
    deferred = t.add.using(run_after=soon).enqueue(2, 2)
    now = t.add.enqueue(3, 3)
    worker_factory()
    wait_for(finished(now, deferred), "the due tasks")
    assert deferred.started_at >= soon
    later.refresh()
    assert later.status == "READY" and later.task.run_after is not None


def test_higher_priority_runs_first(project: str, worker_factory: Callable[..., Worker]) -> None:
    t = djtasks()
    order = [t.add.using(priority=p).enqueue(p, 0) for p in (-60, -10, 0, 60)]
    worker_factory("--queue", "default=1")
    wait_for(finished(*order), "every task")
    by_start = sorted(order, key=lambda r: r.started_at)
    assert [r.task.priority for r in by_start] == [60, 0, -10, -60]


def test_queues_not_served_are_left_alone(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    t = djtasks()
    elsewhere = t.add.using(queue_name="emails").enqueue(1, 1)
    here = t.add.enqueue(2, 2)
    worker = worker_factory("--queue", "default=2")
    wait_for(finished(here), "the served queue's task")
    code, _ = worker.stop()
    elsewhere.refresh()
    assert code == 0 and elsewhere.status == "READY"


def test_retries_are_explicit(project: str, worker_factory: Callable[..., Worker]) -> None:
    """MAX_ATTEMPTS > 1: READY between attempts, FAILED with one error per attempt."""
    from awa.contrib.django.backend import AwaBackend

    retrying = AwaBackend("default", {"QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 2}})
    result = retrying.enqueue(djtasks().fails_value_error, [], {})
    worker_factory()
    seen: set[str] = set()

    def failed_twice() -> bool:
        current = retrying.get_result(result.id)
        seen.add(str(current.status))
        return bool(current.status == "FAILED")

    wait_for(failed_twice, "both attempts to fail", timeout=60)
    result.refresh()
    assert [e.exception_class for e in result.errors] == [ValueError, ValueError]
    assert result.attempts == 2
    assert "FAILED" in seen and seen <= {"READY", "RUNNING", "FAILED"}


def test_many_workers_run_each_task_once(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    results = [djtasks().sleep_for.enqueue(0.1) for _ in range(10)]
    workers = [worker_factory("--queue", "default=2") for _ in range(2)]
    wait_for(finished(*results), "every task", timeout=60)
    assert {r.status for r in results} == {"SUCCESSFUL"}
    assert {r.attempts for r in results} == {1}

    def both_up() -> bool:  # one still starting has no SIGTERM handler yet (-15)
        with psycopg.connect(project) as c:
            row = c.execute("SELECT count(*) FROM awa.presence").fetchone()
            return row is not None and row[0] >= 2

    wait_for(both_up, "both workers to be up", timeout=60)
    for worker in workers:
        assert worker.stop()[0] == 0


def test_interrupt_with_nothing_running(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    worker = worker_factory()
    ran = djtasks().noop.enqueue()
    wait_for(finished(ran), "the worker to be up")
    worker.signal(signal.SIGTERM)
    code, stderr = worker.wait()
    assert code == 0, stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_lets_the_running_task_finish(
        project: str, worker_factory: Callable[..., Worker], sig: int) -> None:
    result = djtasks().sleep_for.enqueue(1.5)
    worker = worker_factory("--shutdown-timeout-ms", "20000")
    wait_for(status_is(result, "RUNNING"), "the task to start")
    assert len(result.worker_ids) == 1
    worker.signal(sig)
    code, stderr = worker.wait()
    assert code == 0, stderr
    result.refresh()
    assert result.status == "SUCCESSFUL" and result.return_value == 1.5


# The worker process itself (issue 43 item 5; the core fixes are issue 40's): a
# sync task cannot be stopped, so past the shutdown timeout (or at a second
# signal) the worker exits without it and its job is left to Awa's rescue.

FAST_RESCUE = {"AWA_TEST_WORKER_OPTIONS": json.dumps({
    "heartbeat_interval_ms": 200, "heartbeat_staleness_ms": 1500,
    "heartbeat_rescue_interval_ms": 200})}


def test_shutdown_timeout_bounds_a_running_sync_task(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    result = djtasks().hang.enqueue()
    worker = worker_factory("--shutdown-timeout-ms", "300")
    wait_for(status_is(result, "RUNNING"), "the task to start")
    worker.signal(signal.SIGTERM)
    code, stderr = worker.wait(timeout=20)  # a generous bound: the task never ends
    assert code == 0, stderr
    assert "1 sync task(s) still running past the shutdown timeout" in stderr
    result.refresh()
    assert result.status == "RUNNING"  # left for rescue, not marked done


def test_a_task_abandoned_at_shutdown_is_rescued_not_lost(
        project: str, worker_factory: Callable[..., Worker]) -> None:
    result = djtasks().hang.enqueue()
    first = worker_factory("--shutdown-timeout-ms", "300", env=FAST_RESCUE)
    wait_for(status_is(result, "RUNNING"), "the task to start")
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=20)[0] == 0
    second = worker_factory(env=FAST_RESCUE)
    wait_for(finished(result), "the rescue", timeout=60)
    assert result.status == "FAILED"  # its one attempt was used
    assert result.errors[-1].exception_class_path.endswith("AwaJobError")
    assert second.stop()[0] == 0


def test_second_interrupt_exits(project: str, worker_factory: Callable[..., Worker]) -> None:
    result = djtasks().hang.enqueue()
    worker = worker_factory("--shutdown-timeout-ms", "600000")
    wait_for(status_is(result, "RUNNING"), "the task to start")
    worker.signal(signal.SIGINT)
    time.sleep(0.5)  # not an assertion on time: the first Ctrl-C must not end it
    assert worker.alive()  # the first Ctrl-C waits for the task
    worker.signal(signal.SIGINT)
    code, stderr = worker.wait(timeout=20)
    assert code == 128 + signal.SIGINT, stderr
    assert "second signal" in stderr
    result.refresh()
    assert result.status == "RUNNING"  # left for rescue


@pytest.mark.parametrize("name, exception", [
    ("calls_sys_exit", SystemExit), ("calls_builtin_exit", SystemExit),
    ("raises_keyboard_interrupt", KeyboardInterrupt)])
def test_exiting_task_fails_without_stopping_the_worker(
        project: str, worker_factory: Callable[..., Worker], name: str,
        exception: type[BaseException]) -> None:
    t = djtasks()
    result = getattr(t, name).enqueue()
    worker = worker_factory()
    wait_for(finished(result), "the task to fail", timeout=15)
    assert result.status == "FAILED"
    assert result.errors[0].exception_class is exception
    after = t.add.enqueue(1, 2)
    wait_for(finished(after), "the worker to run the next task")
    assert after.return_value == 3 and worker.alive()
    assert worker.stop()[0] == 0


def test_async_aenqueue_from_a_running_loop(project: str) -> None:
    """aenqueue/aget_result from async code (Django runs them in its thread)."""
    async def go() -> tuple[Any, Any]:
        result = await djtasks().add.aenqueue(1, 2)
        return result, await djtasks().add.aget_result(result.id)

    from asgiref.sync import async_to_sync

    result, fetched = async_to_sync(go)()
    assert fetched.id == result.id and fetched.args == [1, 2]
