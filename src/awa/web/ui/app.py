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
import json
import time
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
from awa.db.pool import Conn
from awa.errors import AwaError, BatchOperationNotFound, DatabaseError, JobNotFound, ValidationError
from awa.web.ui import actions

STATIC = resources.files("awa.web.ui").joinpath("static")
#: UI reads give up after this long rather than pile up on a busy database.
STATEMENT_TIMEOUT = "5s"
READ_ONLY_RECHECK_S = 30.0

Handler = Callable[[Request], Awaitable[Response]]
#: Request bodies the UI reads, at most (its own POSTs are a few hundred bytes).
MAX_BODY_BYTES = 1024 * 1024
#: Host names a UI without a token answers by default: this machine's loopback.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


class RequestGuard:
    """ASGI middleware: refuse a ``Host`` outside ``allowed_hosts`` (DNS rebinding)
    and bodies over ``max_body`` bytes (413) before the app reads them."""

    def __init__(self, app: Any, allowed_hosts: Sequence[str] | None, max_body: int) -> None:
        self.app = app
        self.allowed = None if allowed_hosts is None or "*" in allowed_hosts \
            else {h.lower().strip("[]") for h in allowed_hosts}
        self.max_body = max_body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        if self.allowed is not None and _host_name(headers.get("host", "")) not in self.allowed:
            await _plain_error(send, 400, "this host name is not allowed (allowed_hosts / "
                                          "awa serve --allowed-host)")
            return
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            await _plain_error(send, 413, f"request body over {self.max_body} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        more = scope["method"] not in ("GET", "HEAD")
        while more:  # the UI's bodies are small: read them whole, up to the cap
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await _plain_error(send, 413, f"request body over {self.max_body} bytes")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body, sent = b"".join(chunks), False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()
        await self.app(scope, replay, send)


def _host_name(host: str) -> str:
    """``Host`` header → name: ``[::1]:8600`` → ``::1``, ``Example.com:80`` → ``example.com``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


async def _plain_error(send: Any, status: int, message: str) -> None:
    data = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


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

    if allowed_hosts is None and token is None:
        allowed_hosts = LOOPBACK_HOSTS
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[
        Middleware(RequestGuard, allowed_hosts=allowed_hosts, max_body=max_body_bytes)])
    app.state.awa = state
    return app

