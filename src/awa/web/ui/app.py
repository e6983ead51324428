"""The web UI as an ASGI app: a JSON API under ``api/`` and a static page.

`ui_app` builds it; mount it anywhere (``app.mount("/awa", ui_app(url))``)
or run it with ``awa serve``. The page uses relative URLs, so a prefix needs
no configuration. Mutations are POSTs that need the header ``X-Awa-Request``
(a browser cannot send it cross-site without CORS) and, when a token is set,
``Authorization: Bearer <token>``; read-only mode refuses them with 403.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

import asyncpg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from awa.client import AsyncClient
from awa.db.pool import Conn
from awa.errors import AwaError, BatchOperationNotFound, DatabaseError, JobNotFound, ValidationError
from awa.web.ui import actions

STATIC = resources.files("awa.web.ui").joinpath("static")
#: UI reads give up after this long rather than pile up on a busy database.
STATEMENT_TIMEOUT = "5s"
READ_ONLY_RECHECK_S = 30.0

Handler = Callable[[Request], Awaitable[Response]]


class UiState:
    """Per-app state: the client (created lazily, so mounting needs no lifespan)."""

    def __init__(self, client: AsyncClient | None, database_url: str | None, schema: str,
                 read_only: bool, token: str | None) -> None:
        self._client = client
        self._url = database_url
        self._schema = schema
        self._owns_client = client is None
        self._lock = asyncio.Lock()
        self.forced_read_only = read_only
        self.token = token
        self._db_read_only: tuple[float, bool] | None = None

    async def client(self) -> AsyncClient:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    self._client = AsyncClient(self._url, max_connections=4, schema=self._schema)
        return self._client

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[Conn]:
        """A read-only transaction with a statement timeout."""
        pool = await (await self.client()).pool()
        async with pool.acquire() as conn, conn.transaction(readonly=True):
            await conn.execute("SELECT set_config('statement_timeout', $1, true)",
                               STATEMENT_TIMEOUT)
            yield conn

    async def read_only(self) -> bool:
        """Forced by the operator, or the database refuses writes (a replica)."""
        if self.forced_read_only:
            return True
        now = time.monotonic()
        if self._db_read_only is None or now - self._db_read_only[0] > READ_ONLY_RECHECK_S:
            client = await self.client()
            ro = bool(await (await client.pool()).fetchval(client._q["ui_is_read_only"]))
            self._db_read_only = (now, ro)
        return self._db_read_only[1]

    async def close(self) -> None:
        if self._owns_client and self._client is not None:
            await self._client.close()


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
            return await handler(request)
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


def ui_app(database_url: str | None = None, *, client: AsyncClient | None = None,
           read_only: bool = False, token: str | None = None, schema: str = "awa") -> Starlette:
    """The web UI. Pass a ``client`` to share its pool, or a URL (None: the
    default database, as `AsyncClient`)."""
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
        return JSONResponse({"read_only": ro, "auth_required": state.token is not None,
                             "authorized": _authorized(state, request), "version": __version__})

    reads, writes = actions.routes(state)
    routes: list[Route | Mount] = [Route("/", index), Route("/api/config", config)]
    routes += [Route(path, _guard(state, h, mutation=False)) for path, h in reads]
    routes += [Route(path, _guard(state, h, mutation=True), methods=["POST"])
               for path, h in writes]
    routes.append(Mount("/static", StaticFiles(directory=str(STATIC)), name="static"))

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await state.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.awa = state
    return app

