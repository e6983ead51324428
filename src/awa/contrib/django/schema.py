"""Awa's schema in a Django project: created by ``manage.py migrate`` (this app's
migrations run Awa's own) or by ``manage.py awa_migrate``."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

import awa
from awa.contrib.django.backend import AwaBackend, database_url_from_settings
from awa.contrib.django.compat import task_backends

__all__ = ["awa_backends", "migrate_for_connection", "run_awa_migrations"]


def awa_backends() -> list[AwaBackend]:
    """Every `AwaBackend` configured in ``TASKS`` (other backends are not built, so
    one that cannot load does not stop ``migrate`` or ``check`` here)."""
    found = []
    for alias, config in getattr(settings, "TASKS", {}).items():
        try:
            cls = import_string(config.get("BACKEND", ""))
        except ImportError:
            continue  # not ours: Django's own check reports it
        if isinstance(cls, type) and issubclass(cls, AwaBackend):
            found.append(task_backends[alias])
    return found


def run_awa_migrations(database_url: str, schema: str) -> list[int]:
    """Apply Awa's pending migrations; works inside a running event loop too."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(awa.migrate(database_url, schema=schema))
    # Called from async code (an async test, an ASGI startup): a thread of its own.
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["applied"] = asyncio.run(awa.migrate(database_url, schema=schema))
        except BaseException as exc:  # re-raised in the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=run, name="awa-migrate")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    applied: list[int] = out["applied"]
    return applied


def migrate_for_connection(apps: Any, schema_editor: Any) -> None:
    """RunPython of this app's migrations: Awa's schema for every `AwaBackend` on the
    database being migrated (backends with ``DATABASE_URL`` use ``awa_migrate``)."""
    connection = schema_editor.connection
    if connection.vendor != "postgresql":  # `manage.py check` reports it
        return
    url = database_url_from_settings(connection.settings_dict)
    done: set[str] = set()
    for backend in awa_backends():
        if backend.database_url is None and backend.database == connection.alias \
                and backend.schema not in done:
            done.add(backend.schema)
            run_awa_migrations(url, backend.schema)
