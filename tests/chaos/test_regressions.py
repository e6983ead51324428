"""Regression tests for the bugs the chaos suite found (fast, no worker processes)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from tests.chaos.proxy import HalfOpenProxy

import awa
from awa.db.queries import queries
from awa.maintenance.services import Rescuer
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


async def test_a_session_stalled_mid_statement_is_ended_by_the_rescue_pass(
        client: awa.AsyncClient, conn: asyncpg.Connection, database_url: str) -> None:
    """A connection that went half-open between asyncpg's prepare (Parse, Describe,
    Flush) and its execute, inside a write transaction, kept that transaction and its
    locks for ever: there PostgreSQL arms neither the statement timeout nor
    idle_in_transaction_session_timeout, and ignores a cancel request (the chaos
    suite's half_open_all: twelve completions blocked on the closures of a frozen
    completion batch's transaction until the workers stopped). The leader's rescue
    pass ends such a session of the runtime's pools."""
    await conn.execute("CREATE TABLE held (k int PRIMARY KEY)")
    target = urlsplit(database_url)
    proxy = HalfOpenProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    url = urlunsplit(target._replace(netloc=f"{target.username}@127.0.0.1:{proxy.port}"
                                     if target.username else f"127.0.0.1:{proxy.port}"))
    stalled = await asyncpg.connect(url, password=target.password,
                                    server_settings={"application_name": "awa-runtime"})
    bystander = await asyncpg.connect(url, password=target.password,
                                      server_settings={"application_name": "awa-runtime"})
    try:
        pid = stalled.get_server_pid()
        await stalled.execute("BEGIN")
        await stalled.execute("INSERT INTO held VALUES (1)")
        proxy.freeze_on_reply()  # the server reads the Parse, its answer is lost
        with pytest.raises(TimeoutError):
            await stalled.fetchval("SELECT count(*) FROM held", timeout=0.5)
        row = await conn.fetchrow("SELECT state, wait_event, backend_xid IS NOT NULL AS xid "
                                  "FROM pg_stat_activity WHERE pid = $1", pid)
        assert dict(row) == {"state": "active", "wait_event": "ClientRead", "xid": True}
        with pytest.raises(asyncpg.LockNotAvailableError):  # its insert holds the key
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '200ms'")
                await conn.execute("INSERT INTO held VALUES (1)")
        await asyncio.sleep(1.0)
        rescuer = Rescuer(await client.pool(), client._q, timedelta(seconds=1), lambda: True,
                          staleness=timedelta(seconds=30), failed_retention=timedelta(days=1),
                          stalled_sessions=["awa-runtime"],
                          stalled_after=timedelta(milliseconds=500))
        await rescuer.run_once()
        assert rescuer.ended_sessions == 1
        await conn.execute("SET lock_timeout = '5s'")
        await conn.execute("INSERT INTO held VALUES (1)")  # the stalled transaction is gone
        assert await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                                   pid) == 0
        # Only sessions stalled mid-statement: a frozen idle one is left alone.
        assert await conn.fetchval("SELECT state FROM pg_stat_activity WHERE pid = $1",
                                   bystander.get_server_pid()) == "idle"
    finally:
        stalled.terminate()
        bystander.terminate()
        proxy.stop()
