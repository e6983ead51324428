"""Statement sequences written once, run by any driver (a "plan").

An enqueue that takes several statements (backpressure's count, then the
insert; the locks and edges of ``after=``) is written as a generator that
yields ``(statement name, parameters)`` and receives the statement's first row
(or None). The client runs a plan on its asyncpg connection (`run`); the
bridge runs the same plan on the application's psycopg, SQLAlchemy or Django
connection. So the rules (what is checked, in which order, what is refused
before anything is written) live in one place, whatever the driver.

Every statement a plan runs answers at most one row that matters (sets come
back as arrays).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol, TypeVar

from awa.db.pool import Conn
from awa.db.queries import Queries

T = TypeVar("T")


class Row(Protocol):
    """A statement's row: an asyncpg ``Record`` or a dict from another driver."""

    def __getitem__(self, key: str, /) -> Any: ...


#: One statement to run: its name in `awa.db.queries` and its bind parameters.
Statement = tuple[str, tuple[Any, ...]]
Plan = Generator[Statement, Row | None, T]


async def run(conn: Conn, q: Queries, plan: Plan[T]) -> T:
    """Run ``plan`` on an asyncpg connection (errors are the caller's to translate)."""
    try:
        name, params = next(plan)
        while True:
            row = await conn.fetchrow(q[name], *params)
            name, params = plan.send(row)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def one(name: str, params: tuple[Any, ...]) -> Plan[Row | None]:
    """A plan of a single statement."""
    row = yield name, params
    return row
