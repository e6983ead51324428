"""The web UI as an ASGI app: a JSON API under ``api/`` and a static page.

`ui_app` builds it; mount it anywhere (``app.mount("/awa", ui_app(url))``)
or run it with ``awa serve``. The page uses relative URLs, so a prefix needs
no configuration. Mutations are POSTs that need the header ``X-Awa-Request``
(a browser cannot send it cross-site without CORS) and, when a token is set,
``Authorization: Bearer <token>``; read-only mode refuses them with 403.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

import asyncpg
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from awa.client import AsyncClient
from awa.core.errors import (
    AwaError,
    BatchOperationNotFound,
    DatabaseError,
    JobNotFound,
    SchemaNotMigrated,
    ValidationError,
)
from awa.db.errors import translate
from awa.web.ui.actions import routes as api_routes
from awa.web.ui.guard import LOOPBACK_HOSTS, MAX_BODY_BYTES, RequestGuard
from awa.web.ui.state import UiState

STATIC = resources.files("awa.web.ui").joinpath("static")

Handler = Callable[[Request], Awaitable[Response]]
def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def _authorized(state: UiState, request: Request) -> bool:
    if state.token is None:
        return True
    header = request.headers.get("authorization", "")
    given = header[7:] if header.lower().startswith("bearer ") else ""
    return hmac.compare_digest(given.encode(), state.token.encode())


def _guard(state: UiState, handler: Handler, *, mutation: bool) -> Handler:
    """Auth, read-only and CSRF checks, and AwaError → JSON error responses."""
    async def wrapped(request: Request) -> Response:
        if not _authorized(state, request):
            return _error(401, "an access token is required")
        if mutation:
            if request.headers.get("x-awa-request") != "1":
                return _error(403, "mutations need the X-Awa-Request header")
            if await state.read_only():
                return _error(403, "read-only mode: mutations are refused")
        try:
            return await _schema_checked(handler, request)
        except SchemaNotMigrated as exc:  # what the CLI, worker and client say too
            return _error(503, str(exc))
        except (JobNotFound, BatchOperationNotFound) as exc:
            return _error(404, str(exc))
        except ValidationError as exc:
            return _error(400, str(exc), field=exc.field, rule=exc.rule)
        except DatabaseError as exc:  # redacted: no password ever reaches a response
            return _error(503, f"database unavailable: {exc}")
        except AwaError as exc:
            return _error(409, str(exc))
        except asyncpg.QueryCanceledError:
            return _error(503, "the query took too long; narrow the filter")
    return wrapped


async def _schema_checked(handler: Handler, request: Request) -> Response:
    """Run ``handler``; a driver error that means "no Awa schema" becomes `SchemaNotMigrated`."""
    try:
        return await handler(request)
    except asyncpg.PostgresError as exc:
        err = translate(exc)
        if isinstance(err, SchemaNotMigrated):
            raise err from exc
        raise


def ui_app(database_url: str | None = None, *, client: AsyncClient | None = None,
           read_only: bool = False, token: str | None = None, schema: str = "awa",
           allowed_hosts: Sequence[str] | None = None,
           max_body_bytes: int = MAX_BODY_BYTES) -> Starlette:
    """The web UI. Pass a ``client`` to share its pool, or a URL (None: the
    default database, as `AsyncClient`).

    ``allowed_hosts``: the ``Host`` names it answers (``["*"]``: any). By default,
    without a token only this machine's loopback names (a DNS-rebinding page
    cannot reach a local UI); with a token any (the token stops such a page)."""
    state = UiState(client, database_url, schema, read_only, token)

    async def index(request: Request) -> Response:
        if not request.url.path.endswith("/"):
            return RedirectResponse(request.url.path + "/")
        return FileResponse(str(STATIC.joinpath("index.html")),
                            headers={"cache-control": "no-cache"})

    async def config(request: Request) -> Response:
        from awa import __version__

        try:
            ro = await state.read_only() if _authorized(state, request) else True
        except DatabaseError as exc:
            return _error(503, f"database unavailable: {exc}")
        except asyncpg.PostgresError as exc:  # no awa.jobs to ask privileges on
            err = translate(exc)
            if not isinstance(err, SchemaNotMigrated):
                raise
            return _error(503, str(err))
        return JSONResponse({"read_only": ro, "auth_required": state.token is not None,
                             "authorized": _authorized(state, request), "version": __version__})

    reads, writes = api_routes(state)
    routes: list[Route | Mount] = [Route("/", index), Route("/api/config", config)]
    routes += [Route(path, _guard(state, h, mutation=False)) for path, h in reads]
    routes += [Route(path, _guard(state, h, mutation=True), methods=["POST"])
               for path, h in writes]
    routes.append(Mount("/static", StaticFiles(directory=str(STATIC)), name="static"))

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await state.close()

    if allowed_hosts is None and token is None:
        allowed_hosts = LOOPBACK_HOSTS
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[
        Middleware(RequestGuard, allowed_hosts=allowed_hosts, max_body=max_body_bytes)])
    app.state.awa = state
    return app

