"""Operators' view of concurrency keys (`client.concurrency_keys`, ``awa queue
keys``): which keys are in flight, at their limit, with how many jobs waiting;
read from the slot and claim indexes, never by reading the backlog."""

from __future__ import annotations

import json
from dataclasses import dataclass

import asyncpg
import pytest
from tests.test_cli import awa_cli

import awa
from awa.db.queries import queries


@dataclass
class Work:
    n: int


async def _keyed_in_flight(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """tenant-a: 2 of 2 in flight, 5 waiting; tenant-b: 1 of 10, none waiting;
    tenant-c on another queue: 1 of the queue's 3 (key_max_in_flight)."""
    await client.enqueue_many_copy([Work(i) for i in range(7)], concurrency_key="tenant-a",
                                   max_in_flight=2)
    await client.enqueue_many_copy([Work(0)], concurrency_key="tenant-b", max_in_flight=10)
    await client.enqueue_many_copy([Work(0)], concurrency_key="tenant-c", queue="other")
    await conn.execute("INSERT INTO awa.queues (queue, key_max_in_flight) VALUES ('other', 3)")
    for queue in ("default", "other"):
        await conn.fetch(queries()["attempt_claim_keyed"], queue, 32, 0.0, 0.0, "", 500)


async def test_keys_in_flight_saturated_first(client: awa.AsyncClient,
                                              conn: asyncpg.Connection) -> None:
    await _keyed_in_flight(client, conn)
    keys = await client.concurrency_keys()
    assert [(k.queue, k.key, k.in_flight, k.max_in_flight, k.waiting, k.saturated)
            for k in keys] == [("default", "tenant-a", 2, 2, 5, True),
                               ("default", "tenant-b", 1, 10, 0, False),
                               ("other", "tenant-c", 1, 3, 0, False)]
    assert not any(k.waiting_at_least for k in keys)
    assert [k.key for k in await client.concurrency_keys("other")] == ["tenant-c"]
    assert [k.key for k in await client.concurrency_keys(limit=1)] == ["tenant-a"]
    with pytest.raises(awa.ValidationError, match="limit"):
        await client.concurrency_keys(limit=0)
    with pytest.raises(awa.ValidationError, match="queue"):
        await client.concurrency_keys("")
    # Existing stats are untouched (awa-pg's QueueStat): the keyed jobs count as before.
    stats = {s.queue: s for s in await client.queue_stats()}
    assert (stats["default"].running, stats["default"].available) == (3, 5)


def test_sync_client_has_it(sync_client: awa.Client) -> None:
    assert sync_client.concurrency_keys() == []


async def test_reads_indexes_only(client: awa.AsyncClient, conn: asyncpg.Connection) -> None:
    """On a backlog the planner knows is big, the statement reads the slot index
    and probes the claim index per key: no sequential scan of awa.jobs."""
    await client.enqueue_many_copy([Work(i) for i in range(20000)],
                                   opts=[{"concurrency_key": f"k{i % 500}"} for i in range(20000)])
    await conn.fetch(queries()["attempt_claim_keyed"], "default", 64, 0.0, 0.0, "", 500)
    await conn.execute("ANALYZE awa.jobs")
    await conn.execute("PREPARE key_stats(text, integer, integer) AS "
                       + queries()["concurrency_key_stats"])
    for mode in ("force_custom_plan", "force_generic_plan"):
        await conn.execute(f"SET plan_cache_mode = {mode}")
        for queue in ("NULL", "'default'"):
            plan = await conn.fetchval(
                f"EXPLAIN (FORMAT JSON) EXECUTE key_stats({queue}, 50, 10000)")
            text = json.dumps(plan)
            assert "Seq Scan" not in text, (mode, queue, text)
            assert "jobs_concurrency_claim_idx" in text, (mode, queue, text)


async def test_cli_queue_keys(client: awa.AsyncClient, conn: asyncpg.Connection,
                              database_url: str) -> None:
    await _keyed_in_flight(client, conn)
    out = awa_cli(database_url, "queue", "keys", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows[0]["key"] == "tenant-a" and rows[0]["saturated"] is True
    assert rows[0]["waiting"] == 5 and rows[0]["max_in_flight"] == 2
    tsv = awa_cli(database_url, "--format", "tsv", "queue", "keys", "--queue", "default")
    assert tsv.returncode == 0, tsv.stderr
    lines = tsv.stdout.splitlines()
    assert lines[0].split("\t") == ["queue", "key", "saturated", "in_flight", "max_in_flight",
                                    "running", "waiting", "waiting_at_least"]
    assert lines[1].split("\t")[:4] == ["default", "tenant-a", "True", "2"]
    assert len(lines) == 3
    table = awa_cli(database_url, "queue", "keys")
    assert table.returncode == 0 and "tenant-a" in table.stdout and "tenant-c" in table.stdout
    bad = awa_cli(database_url, "queue", "keys", "--limit", "0")
    assert bad.returncode != 0
