"""Regression tests for the bugs the chaos suite found (fast, no worker processes)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import asyncpg

import awa
from awa.db.queries import queries
from awa.worker.capacity import Capacity
from awa.worker.config import QueueConfig
from awa.worker.dispatcher import Dispatcher


@dataclass
class Ping:
    n: int


async def test_insert_recovers_after_its_backend_is_terminated(
        client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """The producer's held connection used to stay broken forever once its backend was
    terminated ("another operation is in progress" on every later insert)."""
    await client.enqueue_many_copy([Ping(0)], queue="q")
    await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    ok = 0
    for _ in range(20):
        try:
            ok += await client.enqueue_many_copy([Ping(1)], queue="q")
            break
        except (awa.AwaError, asyncpg.InternalClientError):  # the one failure it may see
            await asyncio.sleep(0.1)
    assert ok == 1
    assert await client.enqueue_many_copy([Ping(2)], queue="q") == 1


class _FlakyPool:
    """Fails the first claim the way asyncpg does when a backend dies mid-operation."""

    def __init__(self) -> None:
        self.calls = 0

    async def fetch(self, *_: Any, **__: Any) -> list[Any]:
        self.calls += 1
        if self.calls == 1:
            raise asyncpg.InternalClientError("cannot switch to state 12; another operation "
                                              "(2) is in progress")
        return []


async def test_dispatcher_survives_an_unexpected_driver_error() -> None:
    """A claim that raised InternalClientError used to end the claim loop for good: the
    worker stayed up and never claimed again."""
    cfg = QueueConfig(name="q", max_workers=2)
    pool = _FlakyPool()
    d = Dispatcher(cfg, pool, queries(), Capacity((cfg,), None),  # type: ignore[arg-type]
                   lambda job: None, 0.01)
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    for _ in range(200):
        if pool.calls >= 3:
            break
        await asyncio.sleep(0.01)
    stop.set()
    d.wake()
    await asyncio.wait_for(task, 5)
    assert pool.calls >= 3
