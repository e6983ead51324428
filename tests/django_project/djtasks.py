"""Tasks outside any app's ``tasks`` module (and outside TASK_MODULES): the worker
must find them by their dotted path when their jobs arrive."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from awa.contrib.django.compat import TaskContext, task


class Rejected(Exception):
    """A project's own exception class."""


@task
def add(a: int, b: int) -> int:
    return a + b


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task
def noop() -> None:
    return None


@task
def fails_value_error() -> None:
    raise ValueError("this task failed with a ValueError")


@task
def fails_own_error(reason: str) -> None:
    raise Rejected(reason)


@task
def fails_nested_exception() -> None:
    # An exception holding another one: its text must survive into the traceback.
    raise ValueError(ValueError("the inner failure"))


@task
def returns_non_json() -> Any:
    return {"when": object()}


@task
def returns_tuple() -> Any:
    return {"pair": (1, 2), "nested": [(3, {"k": (4,)})]}


@task
def calls_sys_exit() -> None:
    sys.exit(1)


@task
def calls_builtin_exit() -> None:
    exit()  # the site builtin a script would call


@task
def raises_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


@task(takes_context=True)
def own_id(context: TaskContext) -> str:
    return str(context.task_result.id)


@task(takes_context=True)
def describe_context(context: TaskContext, n: int) -> dict[str, Any]:
    result = context.task_result
    return {"n": n, "attempt": context.attempt, "status": str(result.status),
            "started": result.started_at is not None, "args": list(result.args),
            "task": result.task.name}


@task
def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@task
def hang() -> None:
    while True:
        time.sleep(0.05)


def plain_function(*args: Any) -> str:
    """Not a task: a job naming it must never call it."""
    raise AssertionError("a plain function was called as a task")


not_callable = 42
