"""The UI's per-app state: its client, read-only transactions, read-only mode."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from awa.client import AsyncClient
from awa.db.pool import Conn

#: UI reads give up after this long rather than pile up on a busy database.
STATEMENT_TIMEOUT = "5s"
READ_ONLY_RECHECK_S = 30.0


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
