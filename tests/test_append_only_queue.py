"""The append-only queue core (docs/storage.md; the prototype in bench/storage_proto/).

Claims find unclaimed rows through snapshot ticks instead of marking rows, so
the properties that matter are the queue's own: every committed job is claimed
exactly once, a rolled-back one never, whatever order producers commit in and
however long they stay open; the first closure of an attempt wins; and a slot
is only truncated when everything in it is spent.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import asyncpg
import pytest

SCHEMA = Path(__file__).parent.parent / "bench" / "storage_proto" / "schema.sql"
INSERT = """INSERT INTO awa_proto.ready (id, queue, priority, kind, args)
            SELECT i, 'q', $2, 'k', '{}'::jsonb FROM unnest($1::bigint[]) i"""
MUTABLE = """INSERT INTO awa_proto.jobs (id, queue, priority, kind, args)
             SELECT i, 'q', $2, 'k', '{}'::jsonb FROM unnest($1::bigint[]) i"""
# A closure is written only for a receipt that exists: once a slot's receipts
# are reclaimed, a late writer for one of them finds nothing to close.
CLOSE = """INSERT INTO awa_proto.closures (slot, id, run_lease, outcome)
           SELECT $1, $2, $3, $4 WHERE EXISTS (
               SELECT 1 FROM awa_proto.receipts WHERE slot = $1 AND id = $2 AND run_lease = $3)
           ON CONFLICT DO NOTHING RETURNING outcome"""


@pytest.fixture
async def proto(empty_database_url: str) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(empty_database_url, min_size=2, max_size=12)
    await pool.execute(SCHEMA.read_text())
    yield pool
    await pool.close()


async def claim(pool: asyncpg.Pool, n: int = 16) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM awa_proto.claim('q', $1)", n)


async def test_every_committed_job_is_claimed_once_and_no_rolled_back_one(
        proto: asyncpg.Pool) -> None:
    """Producers commit out of order, roll back, and stay open across many claims;
    a fifth of their jobs go to the mutable lane; ring jobs are cancelled meanwhile."""
    committed: set[int] = set()
    mutable: set[int] = set()
    cancelled: set[int] = set()  # cancelled while available: never to be claimed
    rolled_back: set[int] = set()
    ids = iter(range(1, 10**9))
    producing = True

    async def producer(seed: int) -> None:
        rng = random.Random(seed)
        async with proto.acquire() as conn:
            for _ in range(40):
                batch = [next(ids) for _ in range(rng.randint(1, 30))]
                tr = conn.transaction()
                await tr.start()
                in_mutable = rng.random() < 0.2  # some into the mutable lane
                if in_mutable:
                    await conn.execute(MUTABLE, batch, rng.randint(1, 4))
                else:
                    await conn.execute(INSERT, batch, rng.randint(1, 4))
                # Some stay open while other transactions commit and claims run.
                await asyncio.sleep(rng.choice([0, 0, 0.001, 0.02, 0.3]))
                cancel_first = not in_mutable and rng.random() < 0.2
                if cancel_first:  # enqueued and cancelled in one transaction
                    assert await conn.fetchval("SELECT awa_proto.cancel($1)",
                                               batch[0]) == "available"
                if rng.random() < 0.15:
                    await tr.rollback()
                    rolled_back.update(batch)
                else:
                    await tr.commit()
                    if cancel_first:
                        cancelled.add(batch[0])
                    committed.update(batch)
                    if in_mutable:
                        mutable.update(batch)

    claimed: list[int] = []

    async def claimer() -> None:
        while True:
            done = not producing  # read first: an empty claim after this means drained
            rows = await claim(proto)
            claimed.extend(r["id"] for r in rows)
            if not rows:
                if done:
                    return
                await asyncio.sleep(0.002)

    async def held_horizon() -> None:
        async with proto.acquire() as conn, conn.transaction():
            await conn.fetchval("SELECT txid_current()")
            while producing:
                await asyncio.sleep(0.05)

    async def canceller() -> None:
        rng = random.Random(99)
        while producing:
            ring_jobs = sorted(committed - mutable)
            if ring_jobs:
                job = rng.choice(ring_jobs)
                if await proto.fetchval("SELECT awa_proto.cancel($1)", job) == "available":
                    cancelled.add(job)
            await asyncio.sleep(0.005)

    claimers = [asyncio.create_task(claimer()) for _ in range(3)]
    holder = asyncio.create_task(held_horizon())
    cancelling = asyncio.create_task(canceller())
    await asyncio.gather(*(producer(s) for s in range(6)))
    producing = False
    await asyncio.gather(*claimers, holder, cancelling)
    # A last claim after every producer has ended finds nothing left over.
    assert await claim(proto, 1000) == []

    counts = Counter(claimed)
    assert set(counts) == committed - cancelled
    assert max(counts.values()) == 1
    assert not rolled_back & set(counts)
    assert len(committed) > 1000 and rolled_back and cancelled


async def test_a_long_open_producer_is_picked_up_when_it_commits(proto: asyncpg.Pool) -> None:
    async with proto.acquire() as long:
        tr = long.transaction()
        await tr.start()
        await long.execute(INSERT, [1, 2], 2)
        for n in range(3, 50):  # later transactions commit and are claimed meanwhile
            await proto.execute(INSERT, [n], 2)
            assert [r["id"] for r in await claim(proto)] == [n]
        await tr.commit()
    assert sorted(r["id"] for r in await claim(proto)) == [1, 2]


async def test_lower_priority_numbers_are_claimed_first(proto: asyncpg.Pool) -> None:
    for priority, first in ((4, 1), (3, 11), (1, 21), (2, 31)):
        await proto.execute(INSERT, list(range(first, first + 10)), priority)
    order = [r["id"] for r in await claim(proto, 40)]
    assert order == [*range(21, 31), *range(31, 41), *range(11, 21), *range(1, 11)]


async def test_the_first_closure_of_an_attempt_wins(proto: asyncpg.Pool) -> None:
    await proto.execute(INSERT, [7], 2)
    (job,) = await claim(proto)
    key = (job["receipt_slot"], job["id"], job["run_lease"])
    results = await asyncio.gather(proto.fetchval(CLOSE, *key, 1), proto.fetchval(CLOSE, *key, 2))
    assert len([r for r in results if r is not None]) == 1
    assert await proto.fetchval("SELECT count(*) FROM awa_proto.closures") == 1


async def test_a_slot_is_truncated_only_when_everything_in_it_is_spent(
        proto: asyncpg.Pool) -> None:
    async def reclaim(slot: int) -> list[str]:
        truncated = []
        for family in ("receipts", "closures", "heartbeats", "ready", "ready_cancels",
                       "claim_log"):
            async with proto.acquire() as conn, conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '100ms'")
                if await conn.fetchval("SELECT awa_proto.reclaim($1, $2::smallint)",
                                       family, slot):
                    truncated.append(family)
        return truncated

    await proto.execute(INSERT, [1, 2, 3], 2)  # into slot 0
    first = await claim(proto, 1)  # job 1, its receipt in slot 0
    await proto.execute("UPDATE awa_proto.ring SET slot = 2")
    # Job 1's attempt is still open: it moves to the mutable lane and its
    # receipts can go; jobs 2 and 3 are not claimed yet, so the ready rows stay.
    assert await reclaim(0) == ["receipts", "closures"]
    assert await proto.fetchval("SELECT state FROM awa_proto.jobs WHERE id = 1") == "running"

    rest = await claim(proto, 10)
    assert [r["id"] for r in rest] == [2, 3]
    # Every job is claimed, but two attempts (receipts in slot 2) still read
    # their ready rows: only the old tick goes.
    assert await reclaim(0) == ["claim_log"]

    for r in rest:
        await proto.fetchval(CLOSE, r["receipt_slot"], r["id"], r["run_lease"], 1)
    assert await reclaim(0) == ["ready"]
    assert await proto.fetchval("SELECT count(*) FROM awa_proto.ready_0") == 0
    # A late closure of job 1's ring attempt writes nothing.
    assert await proto.fetchval(CLOSE, first[0]["receipt_slot"], 1, first[0]["run_lease"], 2) \
        is None

    # A producer still writing into a slot holds reclaiming off until it
    # commits, and then its job is not truncated but claimed.
    await proto.execute("UPDATE awa_proto.ring SET slot = 4")
    async with proto.acquire() as open_producer:
        tr = open_producer.transaction()
        await tr.start()
        await open_producer.execute(INSERT, [99], 2)
        await proto.execute("UPDATE awa_proto.ring SET slot = 5")
        await claim(proto, 1)
        with pytest.raises(asyncpg.LockNotAvailableError):
            await reclaim(4)
        async with proto.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = '30s'")
            waiting = asyncio.create_task(conn.fetchval(
                "SELECT awa_proto.reclaim('ready', 4::smallint)"))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await tr.commit()
            assert await waiting is False
    assert [r["id"] for r in await claim(proto)] == [99]


async def test_a_silent_attempt_is_rescued_and_its_late_completion_dropped(
        proto: asyncpg.Pool) -> None:
    await proto.execute(INSERT, [1, 2], 2)
    a, b = await claim(proto, 2)
    beat = "SELECT awa_proto.heartbeat($1::smallint, $2, $3)"
    assert await proto.fetchval(beat, b["receipt_slot"], b["id"], b["run_lease"])
    await asyncio.sleep(0.3)
    assert await proto.fetchval(beat, b["receipt_slot"], b["id"], b["run_lease"])
    # Silent for longer than the limit: job 1 is rescued, job 2 (heartbeating) is not.
    assert await proto.fetchval("SELECT awa_proto.rescue('0.25 s')") == 1
    (again,) = await claim(proto)
    assert (again["id"], again["run_lease"]) == (1, a["run_lease"] + 1)
    # The rescued attempt's worker finishes late: nothing is written.
    assert await proto.fetchval(CLOSE, a["receipt_slot"], 1, a["run_lease"], 1) is None
    assert not await proto.fetchval(beat, a["receipt_slot"], 1, a["run_lease"])
    # The new attempt and the heartbeating one complete.
    assert await proto.fetchval(CLOSE, again["receipt_slot"], 1, again["run_lease"], 1) == 1
    assert await proto.fetchval(CLOSE, b["receipt_slot"], 2, b["run_lease"], 1) == 1
    assert await proto.fetchval("SELECT awa_proto.rescue('0 s')") == 0


async def test_the_claim_reads_both_lanes_in_priority_order(proto: asyncpg.Pool) -> None:
    """Jobs that need mutable state stay in the mutable lane; priority orders across both."""
    await proto.execute("INSERT INTO awa_proto.jobs (id, queue, priority, kind, args) "
                        "VALUES (101, 'q', 1, 'k', '{}'), (102, 'q', 3, 'k', '{}')")
    await proto.execute(INSERT, [1], 2)
    await proto.execute(INSERT, [2], 1)
    rows = await claim(proto, 10)
    assert [(r["id"], r["receipt_slot"] is None) for r in rows] == [
        (101, True), (2, False), (1, False), (102, True)]
    assert await claim(proto, 10) == []
    assert await proto.fetchval("SELECT count(*) FROM awa_proto.jobs WHERE state = 'running' "
                                "AND run_lease = 1") == 2


async def test_an_idle_queue_is_polled_without_writing(proto: asyncpg.Pool) -> None:
    await proto.execute(INSERT, [1], 2)
    assert len(await claim(proto)) == 1
    await claim(proto)  # the lanes catch up with the last tick
    ticks = await proto.fetchval("SELECT count(*) FROM awa_proto.claim_log")
    async with proto.acquire() as conn, conn.transaction():
        for _ in range(5):
            assert await conn.fetch("SELECT * FROM awa_proto.claim('q', 10)") == []
        assert await conn.fetchval("SELECT pg_current_xact_id_if_assigned()") is None
    assert await proto.fetchval("SELECT count(*) FROM awa_proto.claim_log") == ticks
    await proto.execute(INSERT, [2], 2)  # and the next job is still found
    assert [r["id"] for r in await claim(proto)] == [2]


async def test_a_cancel_reaches_an_available_and_a_running_ring_job(proto: asyncpg.Pool) -> None:
    await proto.execute(INSERT, [1, 2, 3], 2)
    cancel = "SELECT awa_proto.cancel($1)"
    assert await proto.fetchval(cancel, 2) == "available"
    rows = await claim(proto, 10)
    assert [r["id"] for r in rows] == [1, 3]  # the claim passed over job 2
    assert await proto.fetchval(cancel, 1) == "running"
    assert await proto.fetchval(cancel, 1) is None  # already closed
    assert await proto.fetchval(CLOSE, rows[0]["receipt_slot"], 1, rows[0]["run_lease"], 1) \
        is None  # its worker finishes: nothing is written
    assert await proto.fetchval(CLOSE, rows[1]["receipt_slot"], 3, rows[1]["run_lease"], 1) == 1
    assert await claim(proto, 10) == []


async def test_a_long_attempt_moves_to_the_mutable_lane_so_its_slot_can_go(
        proto: asyncpg.Pool) -> None:
    async def reclaim(family: str, slot: int) -> bool:
        async with proto.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = '100ms'")
            return await conn.fetchval("SELECT awa_proto.reclaim($1, $2::smallint)",
                                       family, slot)

    await proto.execute(INSERT, [1], 2)  # slot 0
    (job,) = await claim(proto)  # its receipt in slot 0 too
    await proto.execute("UPDATE awa_proto.ring SET slot = 2")
    await claim(proto)  # a tick after, in slot 2
    assert await reclaim("receipts", 0)
    assert await reclaim("closures", 0)
    assert await reclaim("ready", 0)
    assert await proto.fetchval("SELECT count(*) FROM awa_proto.ready_0") == 0
    # The attempt lives on in the mutable lane, with its run lease and payload.
    moved = await proto.fetchrow("SELECT state, run_lease, kind FROM awa_proto.jobs WHERE id = 1")
    assert dict(moved) == {"state": "running", "run_lease": job["run_lease"], "kind": "k"}
    assert await proto.fetchval(CLOSE, job["receipt_slot"], 1, job["run_lease"], 1) is None


async def test_available_counts_what_a_claim_would_find(proto: asyncpg.Pool) -> None:
    available = "SELECT awa_proto.available('q', $1)"
    assert await proto.fetchval(available, 100) == 0
    await proto.execute(INSERT, list(range(1, 11)), 2)
    await proto.execute(INSERT, [11, 12], 1)
    assert await proto.fetchval(available, 100) == 12
    assert await proto.fetchval(available, 5) == 5
    await claim(proto, 4)  # 11, 12, 1, 2
    await proto.execute(INSERT, [13], 3)
    await proto.fetchval("SELECT awa_proto.cancel(5)")
    assert await proto.fetchval(available, 100) == 12 + 1 - 4 - 1
    async with proto.acquire() as open_producer, open_producer.transaction():
        await open_producer.execute(INSERT, [14], 2)
        assert await proto.fetchval(available, 100) == 8  # not committed yet
    assert await proto.fetchval(available, 100) == 9
    assert len(await claim(proto, 100)) == 9
    assert await proto.fetchval(available, 100) == 0
