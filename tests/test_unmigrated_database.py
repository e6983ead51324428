"""A database without Awa's schema says `awa migrate`; a missing table of the
application's own is its own error, not that."""

from __future__ import annotations

import asyncpg
import pytest

import awa


async def test_a_missing_table_of_yours_is_not_a_missing_awa_schema(
        client: awa.AsyncClient) -> None:
    async with client.transaction() as tx:
        await tx.insert({"a": 1}, kind="k")
        with pytest.raises(awa.DatabaseError) as err:
            await tx.execute("INSERT INTO orders (id) VALUES ($1)", 42)
    assert not isinstance(err.value, awa.SchemaNotMigrated)
    assert 'relation "orders" does not exist' in str(err.value)
    assert isinstance(err.value.__cause__, asyncpg.UndefinedTableError)


async def test_a_missing_awa_schema_still_says_migrate(empty_database_url: str) -> None:
    async with awa.AsyncClient(empty_database_url) as client:
        with pytest.raises(awa.SchemaNotMigrated, match="awa migrate"):
            await client.insert({"a": 1}, kind="k")
        async with client.transaction() as tx:
            with pytest.raises(awa.SchemaNotMigrated):
                await tx.insert({"a": 1}, kind="k")
