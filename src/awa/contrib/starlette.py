"""Awa in a Starlette or FastAPI app: one lifespan opens the client, optionally
runs the worker in-process and mounts the web UI.

    client = awa.AsyncClient()
    app = FastAPI(lifespan=awa_lifespan(client, worker=True, ui="/awa"))

Route handlers reach the client as ``request.app.state.awa`` (or through the
`awa_client` dependency). See docs/fastapi.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from starlette.requests import Request

from awa.client import AsyncClient

__all__ = ["awa_client", "awa_lifespan"]

Lifespan = Callable[[Any], AbstractAsyncContextManager[Any]]


def awa_lifespan(client: AsyncClient, *, worker: bool = False,
                 queues: Iterable[Any] | None = None, ui: str | None = None,
                 ui_read_only: bool = False, ui_token: str | None = None,
                 migrate: bool = False, start_options: Mapping[str, Any] | None = None,
                 shutdown_timeout_ms: int = 5000, then: Lifespan | None = None) -> Lifespan:
    """A ``lifespan`` for ``Starlette(...)``/``FastAPI(...)`` that runs ``client``.

    On startup it opens the pool (``migrate=True`` applies Awa's migrations
    first), puts the client on ``app.state.awa``, mounts the UI at ``ui`` (a
    path such as ``"/awa"``; None: no UI) and, with ``worker=True``, starts
    the worker on ``queues`` (default: every registered task's queue) with
    ``start_options``. ``then`` is your own lifespan, entered inside this one.
    On shutdown the worker drains for up to ``shutdown_timeout_ms``, then the
    pool closes.
    """
    if ui is not None and (not ui.startswith("/") or ui == "/"):
        raise ValueError("ui must be a path below the root, such as '/awa'")

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        await client.pool()
        try:
            if migrate:
                await client.migrate()
            app.state.awa = client
            if ui is not None:
                from awa.web.ui import ui_app

                app.mount(ui.rstrip("/"), ui_app(client=client, read_only=ui_read_only,
                                                 token=ui_token))
            if worker:
                await client.start(queues, **dict(start_options or {}))
            if then is None:
                yield None
            else:
                async with then(app) as state:
                    yield state
        finally:
            await client.shutdown(timeout_ms=shutdown_timeout_ms)
            await client.close()

    return lifespan


def awa_client(request: Request) -> AsyncClient:
    """The app's client, for ``Depends(awa_client)`` or a Starlette endpoint."""
    client = getattr(request.app.state, "awa", None)
    if not isinstance(client, AsyncClient):
        raise RuntimeError("no Awa client on app.state.awa: pass lifespan=awa_lifespan(client)")
    return client
