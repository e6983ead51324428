"""Reads over the append-only lane (migration 0020; docs/storage.md, "Counts,
reads and the UI").

A ring job is a ready row while available and an open receipt while running;
awa.jobs never holds it. Every count, list, gauge, UI read and the producer's
backpressure must show it as it shows the same job in the mutable lane. Each
test turns the lane on for its own database (so it runs the same in both
modes of the suite), puts ring jobs in both states beside a mutable-lane one,
and checks each read against what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

import awa
from awa.db.queries import queries

Q = queries()
CAP = 10_000


@dataclass
class Item:
    n: int


@pytest.fixture
async def ring(conn: asyncpg.Connection) -> asyncpg.Connection:
    """The test database's plain jobs go to the append-only lane."""
    await conn.execute(Q["ring_enqueue_set"], True)
    return conn


async def _claim(conn: asyncpg.Connection, queue: str, n: int) -> list[int]:
    """Claim n jobs of queue as a worker does (awa.claim, both lanes); their ids."""
    rows = await conn.fetch("SELECT id, receipt_slot FROM awa.claim($1, $2, 0, 0)", queue, n)
    assert all(r["receipt_slot"] is not None for r in rows)  # taken from the ring
    return [r["id"] for r in rows]


async def _setup(client: awa.AsyncClient, conn: asyncpg.Connection) -> tuple[
        list[int], list[int], int]:
    """Five ring jobs in queue q, two of them then claimed (running), and one
    scheduled job (mutable lane). Returns (available ids, running ids, scheduled id)."""
    ids = [(await client.insert(Item(i), queue="q")).id for i in range(5)]
    assert await conn.fetchval("SELECT count(*) FROM awa.ready") == 5
    assert await conn.fetchval("SELECT count(*) FROM awa.jobs") == 0
    running = await _claim(conn, "q", 2)
    later = await client.insert(Item(9), queue="q",
                                run_at=datetime.now(UTC) + timedelta(hours=1))
    available = [i for i in ids if i not in running]
    return available, running, later.id


async def test_counts_stats_and_gauges_show_ring_jobs(
        client: awa.AsyncClient, ring: asyncpg.Connection) -> None:
    available, running, scheduled = await _setup(client, ring)
    states = {i: (await client.get_job(i)).state for i in [*available, *running, scheduled]}
    assert [states[i] for i in available] == [awa.JobState.Available] * 3
    assert [states[i] for i in running] == [awa.JobState.Running] * 2
    assert states[scheduled] is awa.JobState.Scheduled

    stats = {s.queue: s for s in await client.queue_stats()}["q"]
    assert (stats.available, stats.running, stats.scheduled) == (3, 2, 1)
    assert stats.lag_seconds is not None and stats.lag_seconds >= 0

    gauges = {(r["queue"], r["state"]): r for r in await ring.fetch(Q["queue_depth_lag"])}
    assert gauges["q", "available"]["depth"] == 3 and gauges["q", "running"]["depth"] == 2
    assert gauges["q", "scheduled"]["depth"] == 1
    assert gauges["q", "available"]["lag_seconds"] is not None

    counts = dict(await ring.fetch(Q["queue_available_counts"], ["q", "other"]))
    assert counts == {"q": 3}
    assert [r["kind"] for r in await ring.fetch(Q["queue_available_kinds"], "q")] == ["item"]
    unserved = await ring.fetch(Q["queue_unserved_kinds"], ["item"], timedelta(minutes=1))
    assert [(r["queue"], r["kind"], r["sampled"]) for r in unserved] == [("q", "item", 3)]
    assert await ring.fetchval(Q["queue_known"], "q")

    ui = await ring.fetchrow(Q["ui_state_counts"], CAP)
    assert (ui["available"], ui["running"], ui["scheduled"]) == (3, 2, 1)
    detail = await ring.fetchrow(Q["ui_queue_detail"], "q", CAP)
    assert (detail["available"], detail["running"]) == (3, 2)
    assert detail["lag_seconds"] is not None and detail["lag_seconds"] >= 0
    assert "q" in [r["queue"] for r in await ring.fetch(Q["ui_queue_names"])]

    status = await ring.fetchrow(Q["storage_status"])
    assert status["active_jobs"] == 6 and status["ring_enqueue"] is True


async def test_lists_show_ring_jobs_newest_first(
        client: awa.AsyncClient, ring: asyncpg.Connection) -> None:
    available, running, scheduled = await _setup(client, ring)
    every = sorted([*available, *running, scheduled], reverse=True)

    assert [j.id for j in await client.list_jobs()] == every
    assert [j.id for j in await client.list_jobs(state=awa.JobState.Available)] == sorted(
        available, reverse=True)
    jobs = await client.list_jobs(state=awa.JobState.Running)
    assert [j.id for j in jobs] == sorted(running, reverse=True)
    assert all(j.attempt == 1 and j.run_lease == 1 and j.attempted_at is not None
               for j in jobs)
    assert [j.id for j in await client.list_jobs(limit=2)] == every[:2]
    any_rows = await ring.fetch(Q["job_list_any"], None, "q", 100)
    assert [r["id"] for r in any_rows] == every

    page = await ring.fetch(Q["ui_jobs_active"], 2**62, None, None, None, None, None, 50, 500)
    assert [r["id"] for r in page] == every
    page = await ring.fetch(Q["ui_jobs_active"], 2**62, "running", None, None, None, None,
                            50, 500)
    assert [r["id"] for r in page] == sorted(running, reverse=True)
    page = await ring.fetch(Q["ui_jobs_all"], every[1], None, None, None, None, None, 50, 500)
    assert [r["id"] for r in page] == every[2:]


async def test_backpressure_counts_available_ring_jobs(
        client: awa.AsyncClient, ring: asyncpg.Connection) -> None:
    await client.enqueue_many_copy([Item(n) for n in range(6)], queue="bp")
    await _claim(ring, "bp", 2)  # running jobs are not queued
    job = await client.insert(Item(7), queue="bp", backpressure="signal")
    assert job.queue_depth is not None and job.queue_depth.depth == 4
    with pytest.raises(awa.QueueFull) as caught:
        await client.insert(Item(8), queue="bp", backpressure=awa.Reject(5))
    assert caught.value.depth == 5
    # The count stops at its cap, ring part included.
    assert await ring.fetchval(Q["depth_available"], "bp", 3) == 3
    # In a transaction, its own uncommitted ring jobs count; another's do not.
    async with client.transaction() as tx:
        await tx.insert(Item(9), queue="bp")
        signalled = await tx.insert(Item(10), queue="bp", backpressure="signal")
        assert signalled.queue_depth is not None and signalled.queue_depth.depth == 6
        other = await ring.fetchval(Q["depth_available"], "bp", CAP)
        assert other == 5
        # Once a later transaction has an id, this one's snapshot shows its own
        # rows as committed: they are counted once still.
        await ring.fetchval("SELECT pg_current_xact_id()")
        again = await tx.insert(Item(11), queue="bp", backpressure="signal")
        assert again.queue_depth is not None and again.queue_depth.depth == 7


# The ring's available jobs by queue as 0024 counted them (every ready row of
# the ring without its receipt or a cancel): the oracle for the cursor count.
ANTI_JOIN = """SELECT w.queue, count(*) AS n, min(w.run_at) AS oldest FROM awa.ready w
               WHERE NOT EXISTS (SELECT 1 FROM awa.receipts r
                                 WHERE r.id = w.id AND r.run_lease = w.lease_base + 1)
                 AND NOT EXISTS (SELECT 1 FROM awa.ready_cancels k WHERE k.slot = w.slot
                                 AND k.id = w.id AND k.lease_base = w.lease_base)
               GROUP BY 1"""


async def test_available_ring_jobs_are_counted_from_the_claim_cursors(
        client: awa.AsyncClient, ring: asyncpg.Connection) -> None:
    """Migration 0025 counts the ring's available jobs by walking each lane from its
    claim cursor (awa.ring_backlog) instead of joining every ready row to the
    receipts: the same counts and oldest run_at, through claims over two
    priorities, a cancel, another transaction's uncommitted jobs and a drained queue."""
    for priority in (1, 3):
        await client.enqueue_many_copy([Item(n) for n in range(3)], queue="a",
                                       priority=priority)
    await client.enqueue_many_copy([Item(n) for n in range(4)], queue="b")
    claimed = await _claim(ring, "a", 2)
    waiting = [j.id for j in await client.list_jobs(state=awa.JobState.Available, queue="a")]
    assert await client.cancel(waiting[-1]) is not None

    async def matches() -> dict[str, tuple[int, float]]:
        expected = {r["queue"]: (r["n"], r["oldest"]) for r in await ring.fetch(ANTI_JOIN)}
        counted = {r["queue"]: (r["n"], r["oldest"]) for r in await ring.fetch(
            "SELECT queue, n, oldest FROM awa.active_counts() WHERE state = 'available'")}
        assert counted == expected
        stats = {s.queue: s for s in await client.queue_stats()}
        return {q: (stats[q].available, stats[q].lag_seconds or 0.0) for q in stats}

    async with client.transaction() as tx:
        await tx.insert(Item(5), queue="a")  # not committed: not counted
        seen = await matches()
    assert seen["a"][0] == 6 - len(claimed) - 1 and seen["b"][0] == 4
    assert seen["a"][0] + 1 == (await matches())["a"][0]
    while await _claim(ring, "a", 10):
        pass
    assert (await matches())["a"] == (0, 0.0)


async def test_queue_stats_stays_linear_after_a_partition_was_seen_empty(
        ring: asyncpg.Connection) -> None:
    """A plan made while a ring partition is empty (and analyzed so) must not turn
    quadratic once the ring turns into it and fills (migration 0024): queue_stats
    planned so ran for minutes at 2,000 jobs/s in the held-xmin cell."""
    conn = ring
    fill = """WITH w AS (INSERT INTO awa.ready (slot, queue, priority, kind, args, max_attempts)
                         SELECT $1, 'big', 2, 'k', '{}', 5 FROM generate_series(1, 20000)
                         RETURNING id),
                   r AS (INSERT INTO awa.receipts (slot, id, run_lease, queue, ready_slot)
                         SELECT $1, id, 1, 'big', $1 FROM w ORDER BY id LIMIT $2 RETURNING id)
              INSERT INTO awa.closures (slot, id, run_lease, outcome)
              SELECT $1, id, 1, awa.ring_outcome('completed') FROM r ORDER BY id LIMIT $3"""
    await conn.execute(fill, 0, 20000, 20000)  # slot 0: 20,000 jobs done
    # Every partition analyzed as autovacuum did: slot 0 full, the others just emptied.
    await conn.execute("ANALYZE awa.ready, awa.receipts, awa.closures")
    await conn.fetch(Q["queue_stats"])  # planned now, and the plan kept by this connection
    assert await conn.fetchval("SELECT awa.ring_advance()") == 1
    await conn.execute(fill, 1, 20000, 15000)  # slot 1: 20,000 claimed, 15,000 done
    began = datetime.now(UTC)
    stats = {r["queue"]: r for r in await conn.fetch(Q["queue_stats"])}
    took = datetime.now(UTC) - began
    assert (stats["big"]["available"], stats["big"]["running"]) == (0, 5_000)
    # Generous: hashing takes tens of milliseconds here; the statement before 0024
    # probed the new partition with a sequential scan per row (8 s at these sizes,
    # minutes at the cell's). PostgreSQL 18 also keeps a plan of the function's own
    # statement per session; its SET clauses keep that one to hash joins too.
    assert took < timedelta(seconds=5), took
