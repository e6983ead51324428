"""`Transaction`: run your own SQL and enqueue jobs atomically with it.

A job inserted here becomes visible (and wakes workers) if and only if the
transaction commits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from types import TracebackType
from typing import Any, Unpack

from awa.core.errors import AwaError
from awa.core.options import EnqueueOptions
from awa.core.results import AsyncWaiter, InsertedJob
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries, rows_affected
from awa.enqueue.pipeline import Held, PerJob, Pipeline
from awa.enqueue.producer import Router
from awa.enqueue.workflow import Node, WorkflowRun, insert_workflow


class Transaction:
    """An open transaction on one pooled connection (``$1`` placeholders)."""

    def __init__(self, conn: Conn, q: Queries,
                 release: Callable[[Conn], Awaitable[None]],
                 router: Router | None = None,
                 waiter: AsyncWaiter | None = None) -> None:
        self._conn = conn
        self._waiter = waiter
        self._router = router
        self._q = q
        self._release = release
        self._tx = conn.transaction()
        self._done = False
        self._enqueue = Pipeline(q, Held(conn), router=router, waiter=waiter)

    async def _begin(self) -> Transaction:
        with translated():
            await self._tx.start()
        return self

    @property
    def connection(self) -> Conn:
        """The underlying asyncpg connection, for code that needs the driver."""
        return self._conn

    async def execute(self, sql: str, *args: Any) -> int:
        """Run a statement; returns the number of rows it affected."""
        with translated():
            status = await self._conn.execute(sql, *args)
        return rows_affected(status)

    async def fetch_one(self, sql: str, *args: Any) -> dict[str, Any]:
        """The first row as a dict; raises `AwaError` if there is none."""
        row = await self.fetch_optional(sql, *args)
        if row is None:
            raise AwaError("query returned no rows")
        return row

    async def fetch_optional(self, sql: str, *args: Any) -> dict[str, Any] | None:
        """The first row as a dict, or None."""
        with translated():
            row = await self._conn.fetchrow(sql, *args)
        return dict(row) if row is not None else None

    async def fetch_all(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        """Every row as a dict."""
        with translated():
            rows = await self._conn.fetch(sql, *args)
        return [dict(r) for r in rows]

    async def insert(self, args: Any, **opts: Unpack[EnqueueOptions]) -> InsertedJob:
        """Enqueue one job inside this transaction (``after``: see `AsyncClient.insert`).

        ``backpressure`` counts the queue on this transaction's connection: jobs
        other producers committed plus the ones this transaction inserted. A
        `QueueFull` leaves the transaction usable; uncaught, it rolls it back."""
        return await self._enqueue.insert(args, opts)

    async def enqueue_workflow(self, workflow: Node, *,
                               after: Iterable[Any] | None = None) -> WorkflowRun:
        """Insert a `chain`, `group` or `chord` inside this transaction (``after``:
        see `AsyncClient.enqueue_workflow`)."""
        return await insert_workflow(self._conn, self._q, workflow, self._router, after)

    async def insert_many(self, jobs: Sequence[Any], *, opts: PerJob = None,
                          **defaults: Unpack[EnqueueOptions]) -> list[InsertedJob]:
        """Enqueue many jobs inside this transaction (duplicate unique keys skipped;
        ``after``: see `AsyncClient.insert_many_copy`)."""
        return await self._enqueue.insert_many(jobs, opts, defaults)

    async def commit(self) -> None:
        """Commit and return the connection to the pool."""
        if not self._done:
            self._done = True
            try:
                with translated():
                    await self._tx.commit()
            finally:
                await self._release(self._conn)

    async def rollback(self) -> None:
        """Roll back and return the connection to the pool."""
        if not self._done:
            self._done = True
            try:
                with translated():
                    await self._tx.rollback()
            finally:
                await self._release(self._conn)

    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback()


class TransactionStart:
    """What ``client.transaction()`` returns: await it, or use ``async with``."""

    def __init__(self, open_tx: Callable[[], Awaitable[Transaction]]) -> None:
        self._open = open_tx
        self._tx: Transaction | None = None

    def __await__(self) -> Generator[Any, None, Transaction]:
        return self._open().__await__()

    async def __aenter__(self) -> Transaction:
        self._tx = await self._open()
        return self._tx

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        assert self._tx is not None
        await self._tx.__aexit__(exc_type, exc, tb)
