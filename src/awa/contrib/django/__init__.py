"""Awa as Django's task backend (``django.tasks``, or the ``django-tasks`` backport).

Add ``"awa.contrib.django"`` to ``INSTALLED_APPS`` and set
``TASKS = {"default": {"BACKEND": "awa.contrib.django.AwaBackend"}}``; run
``manage.py migrate`` (it creates Awa's schema) and ``manage.py awa_worker``
to run tasks.
See docs/django.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AwaBackend"]


def __getattr__(name: str) -> Any:
    # Lazy: importing the app package (INSTALLED_APPS) must not import the task API early.
    if name == "AwaBackend":
        from awa.contrib.django.backend import AwaBackend

        return AwaBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
