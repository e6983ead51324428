"""The app's tasks: plain Django tasks, nothing Awa-specific."""

from __future__ import annotations

import asyncio
import time

from tests.django_project.shop.models import Note

from awa.contrib.django.compat import TaskContext, task


class PaymentDeclined(Exception):
    """A task's own exception class (its path must reach TaskError)."""


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails", priority=50)
def send_email(to: str, *, subject: str = "") -> dict[str, str]:
    return {"to": to, "subject": subject}


@task
def write_note(text: str) -> int:
    return Note.objects.create(text=text).pk


@task
async def async_multiply(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a * b


@task(takes_context=True)
def which_attempt(context: TaskContext, label: str) -> dict[str, object]:
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}


@task
def charge(amount: int) -> None:
    raise PaymentDeclined(f"card declined for {amount}")


@task
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"
