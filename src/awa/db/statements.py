"""A connection seen as "run this named statement": asyncpg's, or the caller's own.

Code that must run the same way on Awa's asyncpg pool and on the application's
psycopg, SQLAlchemy or Django connection (callback resolution and the
follow-ups it inserts, `awa.worker.callbacks`) is written once against
`Statements`. `AsyncpgStatements` is Awa's side; `awa.enqueue.bridge` has the
caller's (its rows normalized and its driver errors already Awa's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from awa.db.pool import Conn
from awa.db.queries import Queries


class Statements(Protocol):
    """Runs Awa's named statements (and transaction control) on one connection."""

    @property
    def in_transaction(self) -> bool:
        """Whether a statement run now runs inside a transaction block."""
        ...

    async def row(self, name: str, params: Sequence[Any]) -> Any:
        """Run the statement called ``name``; its first row, or None."""
        ...

    async def execute(self, sql: str) -> None:
        """Run a control statement (``BEGIN``, ``SAVEPOINT ...``), no parameters."""
        ...


class AsyncpgStatements:
    """`Statements` on an asyncpg connection (driver errors are the caller's to translate)."""

    def __init__(self, conn: Conn, q: Queries) -> None:
        self._conn = conn
        self._q = q

    @property
    def in_transaction(self) -> bool:
        return bool(self._conn.is_in_transaction())

    async def row(self, name: str, params: Sequence[Any]) -> Any:
        return await self._conn.fetchrow(self._q[name], *params)

    async def execute(self, sql: str) -> None:
        await self._conn.execute(sql)
