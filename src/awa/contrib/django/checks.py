"""`manage.py check` for the Awa backends when nothing else runs backends' checks
(the ``django-tasks`` backport does only when its app is installed)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core import checks

__all__ = ["check_awa_backends"]


def check_awa_backends(app_configs: Any = None, **kwargs: Any) -> Iterable[checks.CheckMessage]:
    """Every `AwaBackend`'s own check (the task database must be PostgreSQL)."""
    from awa.contrib.django.schema import awa_backends

    for backend in awa_backends():
        yield from backend.check()
