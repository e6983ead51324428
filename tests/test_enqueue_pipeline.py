"""Every enqueue surface runs the one pipeline (awa.enqueue.pipeline): the same call
writes the same row, whichever surface makes it (client, bulk paths,
transaction, sync client, bridge on asyncpg and psycopg)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import psycopg
import pytest

import awa
from awa.enqueue.bridge import insert_job, insert_job_sync

#: Columns the server chooses per row (the rest must match across surfaces).
_OWN = ("id", "created_at")


@dataclass
class PipelineJob:
    to: str


Surface = Callable[..., Awaitable[Any]]


def _surfaces(client: awa.AsyncClient, sync: awa.Client, app: asyncpg.Connection,
              url: str) -> dict[str, Surface]:
    """Each surface as ``await insert(args, **opts)``, committed when it returns
    (``app``: an application's own asyncpg connection, for the bridge)."""
    def per_job(args: Any, backpressure: Any = "off", **opts: Any) -> Any:
        return client.insert_many([args], opts=[opts], backpressure=backpressure)

    async def in_tx(method: str, args: Any, **opts: Any) -> Any:
        async with client.transaction() as tx:
            return await (tx.insert(args, **opts) if method == "insert"
                          else tx.insert_many([args], **opts))

    def psycopg_sync(args: Any, **opts: Any) -> Any:
        with psycopg.connect(url, autocommit=True) as pg:
            return insert_job_sync(pg, args, **opts)

    return {
        "client.insert": client.insert,
        "client.insert_many": lambda a, **o: client.insert_many([a], **o),
        "client.insert_many(opts=)": per_job,
        "client.insert_many_copy": lambda a, **o: client.insert_many_copy([a], **o),
        "client.enqueue_many_copy": lambda a, **o: client.enqueue_many_copy([a], **o),
        "transaction.insert": lambda a, **o: in_tx("insert", a, **o),
        "transaction.insert_many": lambda a, **o: in_tx("insert_many", a, **o),
        "sync.insert": lambda a, **o: asyncio.to_thread(sync.insert, a, **o),
        "sync.insert_many_copy": lambda a, **o: asyncio.to_thread(sync.insert_many_copy,
                                                                   [a], **o),
        "bridge.insert_job(asyncpg)": lambda a, **o: insert_job(app, a, **o),
        "bridge.insert_job_sync(psycopg)": lambda a, **o: asyncio.to_thread(psycopg_sync, a,
                                                                            **o),
    }


async def _last_row(conn: asyncpg.Connection) -> dict[str, Any]:
    row = await conn.fetchrow("SELECT * FROM awa.jobs ORDER BY id DESC LIMIT 1")
    assert row is not None
    edges = await conn.fetch("SELECT parent_id, policy, ordinal FROM awa.job_dependencies "
                             "WHERE child_id = $1 ORDER BY ordinal", row["id"])
    return {**{k: v for k, v in row.items() if k not in _OWN},
            "edges": [tuple(e) for e in edges]}


@pytest.mark.parametrize("waits", [False, True], ids=["plain", "after"])
async def test_every_surface_writes_the_same_row(client: awa.AsyncClient, sync_client: awa.Client,
                                                 conn: asyncpg.Connection, database_url: str,
                                                 waits: bool) -> None:
    opts: dict[str, Any] = dict(
        queue="pipeline", priority=3, max_attempts=7, tags=["a", "b"], metadata={"m": 1},
        ordering_key="order", concurrency_key="key", max_in_flight=2, backpressure="signal")
    if waits:
        parent = await client.insert(PipelineJob("parent"), queue="parents")
        opts.update(after=[parent.id], on_parent_failure="run_anyway")
    else:
        opts["run_at"] = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    rows = {}
    app = await asyncpg.connect(database_url)
    try:
        for name, insert in _surfaces(client, sync_client, app, database_url).items():
            await insert(PipelineJob("x"), **opts)
            rows[name] = await _last_row(conn)
    finally:
        await app.close()
    first = rows["client.insert"]
    assert first["kind"] == "pipeline_job" and first["queue"] == "pipeline"
    assert first["edges"] == ([(parent.id, "run_anyway", 0)] if waits else [])
    assert {name: row for name, row in rows.items() if row != first} == {}
