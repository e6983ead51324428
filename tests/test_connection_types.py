"""Connections look up PostgreSQL's own array types once per process (AwaConnection).

asyncpg runs its type introspection query (about 17 ms of server time) on
each new connection before the first statement using an array type other
than text[] or oid[]; a worker opens several connections, each first using a
different few, and a pool reconnects after idling. Awa reuses the rows of
PostgreSQL's own types (fixed OIDs) across connections, and leaves types
that belong to a database (enums, composites) to asyncpg as before.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from awa.db import pool as pool_module
from awa.db.pool import create_pool


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[int]]]:
    """The type OIDs each run of asyncpg's own introspection asked for, from an
    empty process-wide cache."""
    monkeypatch.setattr(pool_module, "_builtin_types", {})
    asked: list[list[int]] = []
    real = asyncpg.Connection._introspect_types

    async def counting(self: asyncpg.Connection, typeoids: Any, timeout: Any) -> Any:
        asked.append(list(typeoids))
        return await real(self, typeoids, timeout)

    monkeypatch.setattr(asyncpg.Connection, "_introspect_types", counting)
    yield asked


@pytest.fixture
async def two_connections(empty_database_url: str
                          ) -> AsyncIterator[tuple[asyncpg.Connection, asyncpg.Connection]]:
    pool = await create_pool(empty_database_url, max_connections=2)
    try:
        async with pool.acquire() as a, pool.acquire() as b:
            yield a, b
    finally:
        await pool.close()


ROUND_TRIP = ("SELECT $1::bigint[] AS ids, $2::boolean[] AS flags, $3::smallint[] AS slots, "
              "$4::jsonb[] AS docs, $5::timestamptz[] AS ats, $6::float8[] AS xs")
VALUES = ([1, 2**40], [True, False], [3, 0], [{"a": [1, "x"]}, None],
          [dt.datetime(2026, 12, 7, 5, 0, tzinfo=dt.UTC)], [0.5, -1.0])


async def test_a_second_connection_looks_up_no_builtin_array_type(
        lookups: list[list[int]],
        two_connections: tuple[asyncpg.Connection, asyncpg.Connection]) -> None:
    first, second = two_connections
    assert await first.fetchval("SELECT $1::bigint[]", [1]) == [1]
    assert len(lookups) == 1  # the first one, taking the common array types with it
    assert 1000 in lookups[0] and 3807 in lookups[0]  # boolean[] and jsonb[] too
    row = await second.fetchrow(ROUND_TRIP, *VALUES)
    assert tuple(row) == VALUES  # the same values back, jsonb through Awa's codec
    assert len(lookups) == 1, lookups
    # the first connection, too, had them all from its one lookup
    assert tuple(await first.fetchrow(ROUND_TRIP, *VALUES)) == VALUES
    assert len(lookups) == 1, lookups
    # arrays whose elements need rows of their own (a range; a domain over an
    # integer, information_schema's) are looked up on each connection as before
    for conn in (first, second):
        span = await conn.fetchval("SELECT ARRAY[int4range(1, 3)]")
        assert (span[0].lower, span[0].upper) == (1, 3)
        assert await conn.fetchval(
            "SELECT array_agg(ordinal_position ORDER BY ordinal_position) "
            "FROM information_schema.columns WHERE table_name = 'pg_class' "
            "AND ordinal_position <= 2") == [1, 2]


async def test_a_databases_own_types_are_looked_up_on_each_connection(
        lookups: list[list[int]],
        two_connections: tuple[asyncpg.Connection, asyncpg.Connection]) -> None:
    first, second = two_connections
    await first.execute("CREATE TYPE mood AS ENUM ('ok', 'meh')")
    assert await first.fetchval("SELECT $1::mood[]", ["ok"]) == ["ok"]
    assert await second.fetchval("SELECT $1::mood[]", ["meh"]) == ["meh"]
    mood = await first.fetchval("SELECT 'mood[]'::regtype::oid")
    assert [mood in asked for asked in lookups].count(True) == 2, lookups
    # a type made again has a new OID: a cache of it would decode wrongly
    await first.execute("DROP TYPE mood; CREATE TYPE mood AS ENUM ('a', 'b')")
    await second.reload_schema_state()
    assert await second.fetchval("SELECT $1::mood[]", ["b"]) == ["b"]
