"""Django's task API: ``django.tasks`` (Django 6.0+) when present, else the
``django-tasks`` backport (same API, Django 4.2+, Python 3.11).

Everything else in `awa.contrib.django` imports these names from here, so the
two sources differ in this one module only.
"""

from __future__ import annotations

import importlib.util
from typing import Any

if importlib.util.find_spec("django.tasks") is not None:  # pragma: no cover - Django 6 only
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    SOURCE = "django.tasks"
else:
    from django_tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django_tasks.exceptions import (
        InvalidTaskError as InvalidTask,
    )
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import (
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_tasks.utils import normalize_json

    SOURCE = "django_tasks"

TaskType = Any  #: a `Task` of either source (their classes differ)

__all__ = [
    "DEFAULT_TASK_PRIORITY", "DEFAULT_TASK_QUEUE_NAME", "SOURCE", "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY", "BaseTaskBackend", "InvalidTask", "Task", "TaskContext", "TaskError",
    "TaskResult", "TaskResultDoesNotExist", "TaskResultStatus", "TaskType",
    "default_task_backend", "normalize_json", "task", "task_backends", "task_enqueued",
    "task_finished", "task_started",
]
