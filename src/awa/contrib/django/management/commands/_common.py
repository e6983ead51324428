"""Shared by the management commands: find the Awa backend named on the command line."""

from __future__ import annotations

from django.core.management.base import CommandError

from awa.contrib.django.backend import AwaBackend
from awa.contrib.django.compat import task_backends


def awa_backend(alias: str) -> AwaBackend:
    """The `AwaBackend` configured as ``TASKS[alias]``, or a `CommandError`."""
    try:
        backend = task_backends[alias]
    except Exception as exc:
        raise CommandError(f"no task backend {alias!r}: {exc}") from exc
    if not isinstance(backend, AwaBackend):
        raise CommandError(f"TASKS[{alias!r}] is {type(backend).__name__}, not "
                           "awa.contrib.django.AwaBackend")
    return backend
