"""The Awa web UI inside a Django project's ASGI application.

In ``asgi.py``::

    from django.core.asgi import get_asgi_application
    from awa.contrib.django.asgi import with_awa_ui

    application = with_awa_ui(get_asgi_application(), path="/awa")

Requests below ``path`` go to the UI (on the task backend's database), all
others to Django. Read-only by default: pass ``token=`` (and
``read_only=False``) to allow retries, cancels and the other actions.
Needs the ``ui`` extra (Starlette).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from awa.contrib.django.compat import task_backends

__all__ = ["with_awa_ui"]

Scope = MutableMapping[str, Any]
Asgi = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                Awaitable[None]]


def with_awa_ui(django_app: Asgi, *, path: str = "/awa", backend: str = "default",
                read_only: bool = True, token: str | None = None) -> Asgi:
    """An ASGI app serving the Awa UI at ``path`` and ``django_app`` everywhere else."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from awa.contrib.django.backend import AwaBackend
    from awa.web.ui import ui_app

    prefix = path.rstrip("/")
    if not prefix.startswith("/"):
        raise ValueError("path must be a path below the root, such as '/awa'")
    tasks = task_backends[backend]
    if not isinstance(tasks, AwaBackend):
        raise TypeError(f"TASKS[{backend!r}] is not awa.contrib.django.AwaBackend")
    ui = ui_app(tasks.worker_database_url(), schema=tasks.schema, read_only=read_only,
                token=token)
    mounted = Starlette(routes=[Mount(prefix, app=ui)])

    async def app(scope: Scope, receive: Callable[[], Awaitable[Any]],
                  send: Callable[[Any], Awaitable[None]]) -> None:
        request_path = scope.get("path", "")
        if scope["type"] == "lifespan" or request_path == prefix \
                or request_path.startswith(prefix + "/"):
            await mounted(scope, receive, send)  # Django's handler refuses lifespan
        else:
            await django_app(scope, receive, send)
    return app
