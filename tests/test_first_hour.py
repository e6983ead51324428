"""What a new user hits in the first hour (issue 31)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

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


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local time zone is New York for the test."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def test_naive_run_at_is_local_time(client: awa.AsyncClient, new_york: None) -> None:
    in_ten = datetime.now() + timedelta(minutes=10)  # naive, New York wall clock
    job = await client.insert({"a": 1}, kind="k", run_at=in_ten)
    assert job.state is awa.JobState.Scheduled
    assert abs(job.run_at - (datetime.now(UTC) + timedelta(minutes=10))) < timedelta(seconds=5)
    assert job.run_at == datetime.fromtimestamp(in_ten.timestamp(), UTC)
