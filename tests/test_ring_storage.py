"""The append-only lane of migration 0020 (docs/storage.md), at the SQL level.

The properties of tests/test_append_only_queue.py (which tests the prototype
in bench/storage_proto/), checked against the real schema: every committed
job is claimed exactly once and a rolled-back one never, whatever order
producers commit in and however long they stay open; priorities (with aging)
order both lanes; the first closure of an attempt wins, and an attempt moved
to the mutable lane (materialized, rescued, carried out of a reclaimed slot)
is closed there only; a slot is truncated only when everything in it is spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest

from awa.db import migrations
from awa.db.queries import queries
from awa.maintenance.ring import RingKeeper

# n ring jobs of queue q at priority $2 (run_at $3, default now), ids in insert order;
# their lane made known to claims, as the package's inserts do.
RING = """WITH lane AS (INSERT INTO awa.ring_lanes SELECT 'q', $2 WHERE NOT EXISTS (
                          SELECT 1 FROM awa.ring_lanes WHERE queue = 'q' AND priority = $2)
                      ON CONFLICT DO NOTHING)
          INSERT INTO awa.ready (slot, id, queue, priority, kind, args, max_attempts, run_at)
          SELECT awa.ring_slot(), nextval(pg_get_serial_sequence('awa.jobs', 'id')), 'q', $2,
                 'k', '{}'::jsonb, 5, coalesce($3::text::timestamptz, now())
          FROM generate_series(1, $1) RETURNING id"""
MUTABLE = """INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts, run_at)
             SELECT 'k', 'q', '{}'::jsonb, 'available', $2, 5,
                    coalesce($3::text::timestamptz, now())
             FROM generate_series(1, $1) RETURNING id"""
# A closure is written only for a receipt that exists: once a slot's receipts
# are reclaimed, a late writer for one of them finds nothing to close.
CLOSE = """INSERT INTO awa.closures (slot, id, run_lease, outcome)
           SELECT $1, $2, $3, awa.ring_outcome('completed') WHERE EXISTS (
               SELECT 1 FROM awa.receipts WHERE slot = $1 AND id = $2 AND run_lease = $3)
           ON CONFLICT DO NOTHING RETURNING outcome"""
MATERIALIZE = "SELECT array(SELECT awa.ring_materialize(array[$1::smallint], array[$2::bigint]," \
              " array[$3::bigint]))"
UNREADY = "SELECT array(SELECT awa.ring_unready($1::bigint[]))"
AVAILABLE = "SELECT awa.ring_available('q', $1)"
# The maintenance service's order (awa.maintenance.ring.FAMILIES).
FAMILIES = ("ready", "ready_cancels", "receipts", "closures", "heartbeats", "claim_log")

Conn = asyncpg.Pool | asyncpg.Connection


@pytest.fixture
async def pool(empty_database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """The test's database with the package's migrations applied (0020 included)."""
    pool = await asyncpg.create_pool(empty_database_url, min_size=2, max_size=12)
    async with pool.acquire() as conn:
        await migrations.apply(conn)
        # Every lane of queue q known (committed) up front, as after its first use:
        # producers that stay open must not wait for one another's first insert.
        await conn.execute("INSERT INTO awa.ring_lanes SELECT 'q', p FROM generate_series(1, 4) p")
    yield pool
    await pool.close()


async def ring(db: Conn, n: int = 1, priority: int = 2, run_at: str | None = None) -> list[int]:
    return [r["id"] for r in await db.fetch(RING, n, priority, run_at)]


async def mutable(db: Conn, n: int = 1, priority: int = 2, run_at: str | None = None) -> list[int]:
    return [r["id"] for r in await db.fetch(MUTABLE, n, priority, run_at)]


async def claim(db: Conn, n: int = 16, aging: float = 0) -> list[asyncpg.Record]:
    return await db.fetch("SELECT * FROM awa.claim('q', $1, 0, $2)", n, aging)


def attempt(job: asyncpg.Record) -> tuple[int, int, int]:
    return job["receipt_slot"], job["id"], job["run_lease"]


def columns(jobs: list[asyncpg.Record]) -> tuple[list[int], list[int], list[int]]:
    """The attempts of ``jobs`` as three arrays: slots, ids, leases."""
    return ([j["receipt_slot"] for j in jobs], [j["id"] for j in jobs],
            [j["run_lease"] for j in jobs])


async def reclaim(pool: asyncpg.Pool, family: str, slot: int) -> bool:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL lock_timeout = '100ms'")
        ok: bool = await conn.fetchval("SELECT awa.ring_reclaim($1, $2::smallint)", family, slot)
        return ok


async def reclaim_slot(pool: asyncpg.Pool, slot: int) -> list[str]:
    return [family for family in FAMILIES if await reclaim(pool, family, slot)]


async def move_ring_to(pool: asyncpg.Pool, slot: int) -> None:
    while await pool.fetchval("SELECT awa.ring_slot()") != slot:
        assert await pool.fetchval("SELECT awa.ring_advance()") is not None


async def test_every_committed_job_is_claimed_once_and_no_rolled_back_one(
        pool: asyncpg.Pool) -> None:
    """Producers commit out of order, roll back, and stay open across many claims while
    a transaction holds the horizon; a fifth of their jobs go to the mutable lane; ring
    jobs are moved to the mutable lane (ring_unready) meanwhile, and claimed from there."""
    committed: set[int] = set()
    unreadied: set[int] = set()
    rolled_back: set[int] = set()
    producing = True

    async def producer(seed: int) -> None:
        rng = random.Random(seed)
        async with pool.acquire() as conn:
            for _ in range(40):
                tr = conn.transaction()
                await tr.start()
                in_mutable = rng.random() < 0.2
                batch = await (mutable if in_mutable else ring)(
                    conn, rng.randint(1, 30), rng.randint(1, 4))
                # Some stay open while other transactions commit and claims run.
                await asyncio.sleep(rng.choice([0, 0, 0.001, 0.02, 0.3]))
                unready_first = not in_mutable and rng.random() < 0.2
                if unready_first:  # enqueued and moved in one transaction
                    assert await conn.fetchval(UNREADY, batch[:1]) == batch[:1]
                if rng.random() < 0.15:
                    await tr.rollback()
                    rolled_back.update(batch)
                else:
                    await tr.commit()
                    committed.update(batch)
                    if unready_first:
                        unreadied.add(batch[0])

    claimed: list[asyncpg.Record] = []

    async def claimer(aging: float) -> None:
        while True:
            done = not producing  # read first: an empty claim after this means drained
            rows = await claim(pool, 16, aging)
            claimed.extend(rows)
            if not rows:
                if done:
                    return
                await asyncio.sleep(0.002)

    async def held_horizon() -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.fetchval("SELECT pg_current_xact_id()")
            while producing:
                await asyncio.sleep(0.05)

    async def unreadier() -> None:
        rng = random.Random(99)
        while producing:
            if committed:
                job = rng.choice(sorted(committed))
                unreadied.update(await pool.fetchval(UNREADY, [job]))
            await asyncio.sleep(0.005)

    claimers = [asyncio.create_task(claimer(aging)) for aging in (0, 0, 5)]
    holder = asyncio.create_task(held_horizon())
    moving = asyncio.create_task(unreadier())
    await asyncio.gather(*(producer(s) for s in range(6)))
    producing = False
    await asyncio.gather(*claimers, holder, moving)
    # A last claim after every producer has ended finds nothing left over.
    assert await claim(pool, 1000) == []

    counts = Counter(r["id"] for r in claimed)
    assert set(counts) == committed
    assert max(counts.values()) == 1
    assert not rolled_back & set(counts)
    # A job moved out of the ring before its claim is claimed from the mutable lane.
    assert {r["id"] for r in claimed if r["receipt_slot"] is None} >= unreadied
    assert len(committed) > 1000 and rolled_back and unreadied


async def test_a_long_open_producer_is_picked_up_when_it_commits(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as long:
        tr = long.transaction()
        await tr.start()
        early = await ring(long, 2)
        for _ in range(20):  # later transactions commit and are claimed meanwhile
            later = await ring(pool)
            assert [r["id"] for r in await claim(pool)] == later
        await tr.commit()
    assert [r["id"] for r in await claim(pool)] == early


async def test_lower_priority_numbers_are_claimed_first(pool: asyncpg.Pool) -> None:
    lanes = {priority: await ring(pool, 10, priority) for priority in (4, 3, 1, 2)}
    order = [r["id"] for r in await claim(pool, 40)]
    assert order == [*lanes[1], *lanes[2], *lanes[3], *lanes[4]]


async def test_the_claim_reads_both_lanes_in_priority_order(pool: asyncpg.Pool) -> None:
    (m1,) = await mutable(pool, 1, 1, "2000-01-01")
    (m3,) = await mutable(pool, 1, 3)
    (r2,) = await ring(pool, 1, 2)
    (r1,) = await ring(pool, 1, 1)
    rows = await claim(pool, 10)
    assert [(r["id"], r["receipt_slot"] is None) for r in rows] == [
        (m1, True), (r1, False), (r2, False), (m3, True)]
    assert await claim(pool, 10) == []
    assert await pool.fetchval("SELECT count(*) FROM awa.jobs WHERE state = 'running' "
                               "AND run_lease = 1") == 2


async def test_aging_lets_an_old_low_priority_job_go_first(pool: asyncpg.Pool) -> None:
    (fresh,) = await ring(pool, 1, 1)
    (old_ring,) = await ring(pool, 1, 4, "2000-01-02")
    (old_mutable,) = await mutable(pool, 1, 3, "2000-01-01")
    async with pool.acquire() as conn:
        tr = conn.transaction()
        await tr.start()  # without aging: priority alone (rolled back, to claim again)
        assert [r["id"] for r in await claim(conn, 3)] == [fresh, old_mutable, old_ring]
        await tr.rollback()
    # With aging every job waited long enough to reach priority 1: the oldest go first.
    assert [r["id"] for r in await claim(pool, 3, aging=60)] == [old_mutable, old_ring, fresh]


async def test_the_first_closure_of_an_attempt_wins(pool: asyncpg.Pool) -> None:
    await ring(pool, 3)
    a, b, c = await claim(pool)
    results = await asyncio.gather(pool.fetchval(CLOSE, *attempt(a)),
                                   pool.fetchval(CLOSE, *attempt(a)))
    assert len([r for r in results if r is not None]) == 1
    # A completion racing a move to the mutable lane: exactly one of them happens.
    closed, moved = await asyncio.gather(pool.fetchval(CLOSE, *attempt(b)),
                                         pool.fetchval(MATERIALIZE, *attempt(b)))
    assert (closed is not None) != (moved == [b["id"]])
    assert await pool.fetchval("SELECT count(*) FROM awa.jobs WHERE id = $1", b["id"]) == \
        len(moved)
    assert await pool.fetchval("SELECT count(*) FROM awa.closures") == 2
    assert await pool.fetchval(CLOSE, *attempt(c)) is not None


@pytest.mark.parametrize("rival_commits", [True, False])
async def test_a_completion_racing_a_rival_closure_keeps_the_first_one(
        pool: asyncpg.Pool, rival_commits: bool) -> None:
    """Migration 0025: the completion inserts its closures without ON CONFLICT. A
    rival closure of one of its attempts (here a move to the mutable lane) that is
    still open when the completion looks makes the completion wait for it; if the
    rival commits, the rival's closure stands and the rest of the batch completes,
    with no error; if it rolls back, the completion closes every attempt."""
    from datetime import timedelta

    from awa.db.queries import queries
    await ring(pool, 2)
    a, b = await claim(pool)
    async with pool.acquire() as rival, pool.acquire() as worker:
        tx = rival.transaction()
        await tx.start()
        assert await rival.fetchval(MATERIALIZE, *attempt(a)) == [a["id"]]
        completing = asyncio.ensure_future(worker.fetch(
            queries()["attempt_complete_batch"], [a["id"], b["id"]],
            [a["run_lease"], b["run_lease"]], None, timedelta(days=1),
            [a["receipt_slot"], b["receipt_slot"]]))
        async def waits_for_the_rival() -> bool:
            return bool(await pool.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                worker.get_server_pid()))
        for _ in range(200):
            if await waits_for_the_rival():
                break
            await asyncio.sleep(0.05)
        assert not completing.done()
        await (tx.commit() if rival_commits else tx.rollback())
        done = {r["id"] for r in await completing}
    outcomes = dict(await pool.fetch(
        "SELECT id, outcome FROM awa.closures WHERE id = ANY($1::bigint[])", [a["id"], b["id"]]))
    completed, moved = (await pool.fetchval("SELECT awa.ring_outcome('completed')"),
                        await pool.fetchval("SELECT awa.ring_outcome('moved')"))
    finished = {r["id"] for r in await pool.fetch("SELECT id FROM awa.jobs_done")}
    if rival_commits:
        assert done == finished == {b["id"]}
        assert outcomes == {a["id"]: moved, b["id"]: completed}
        assert await pool.fetchval("SELECT state::text FROM awa.jobs WHERE id = $1",
                                   a["id"]) == "running"
    else:
        assert done == finished == {a["id"], b["id"]}
        assert outcomes == {a["id"]: completed, b["id"]: completed}
        assert await pool.fetchval("SELECT count(*) FROM awa.jobs") == 0


async def test_closing_probes_the_closures_index_after_analyze_saw_them_empty(
        pool: asyncpg.Pool) -> None:
    """awa.ring_close looks for an attempt's closure by the unique index, one probe
    per attempt, even with a plan made while the closures were analyzed empty and
    reused after they filled (a hash of every closure per batch was 0.3 s a call
    at 100,000 closures)."""
    await ring(pool, 300)
    jobs = await claim(pool, 300)
    slot = jobs[0]["receipt_slot"]
    async with pool.acquire() as conn:
        await conn.execute("ANALYZE awa.closures")
        close = ("SELECT count(*) FROM awa.ring_close($1::smallint[], $2::bigint[],"
                 " $3::bigint[], awa.ring_outcome('completed'))")
        for batch in range(10):  # past plpgsql's first custom plans: the generic one
            part = jobs[batch * 10:(batch + 1) * 10]
            assert await conn.fetchval(close, *columns(part)) == 10
        await conn.execute(
            "INSERT INTO awa.closures (slot, id, run_lease, outcome) SELECT $1, -g, 1, 1 "
            "FROM generate_series(1, 20000) g", slot)
        # This backend's scan counts not yet reported (earlier statements' too):
        # what the call adds to them.
        counts = ("SELECT sum(seq_scan) AS seq, sum(idx_scan) AS idx "
                  "FROM pg_stat_xact_user_tables WHERE relname LIKE 'closures%'")
        async with conn.transaction():
            before = await conn.fetchrow(counts)
            part = jobs[100:300]
            assert await conn.fetchval(close, *columns(part)) == 200
            after = await conn.fetchrow(counts)
    assert after["seq"] == before["seq"], (dict(before), dict(after))
    assert after["idx"] - before["idx"] >= 200


async def test_a_materialized_attempt_lives_on_in_the_mutable_lane(pool: asyncpg.Pool) -> None:
    await ring(pool, 2)
    a, b = await claim(pool)
    assert await pool.fetchval(CLOSE, *attempt(a)) is not None
    assert await pool.fetchval(MATERIALIZE, *attempt(a)) == []  # closed: nothing moves
    assert await pool.fetchval(MATERIALIZE, *attempt(b)) == [b["id"]]
    assert await pool.fetchval(MATERIALIZE, *attempt(b)) == []  # moved once
    moved = await pool.fetchrow("SELECT state, run_lease, attempt, kind, queue FROM awa.jobs "
                                "WHERE id = $1", b["id"])
    assert dict(moved) == {"state": "running", "run_lease": b["run_lease"], "attempt": 1,
                           "kind": "k", "queue": "q"}
    assert await pool.fetchval(CLOSE, *attempt(b)) is None  # its ring completion writes nothing
    assert await pool.fetchval("SELECT count(*) FROM awa.jobs WHERE id = $1", a["id"]) == 0


async def test_a_silent_attempt_is_rescued_and_a_heartbeating_one_left_alone(
        pool: asyncpg.Pool) -> None:
    await ring(pool, 2)
    a, b = await claim(pool, 2)
    beat = "INSERT INTO awa.heartbeats (slot, id, run_lease, at) VALUES ($1, $2, $3, $4)"
    # Both were claimed an hour ago; a was last heard of half an hour ago, b just now.
    await pool.execute("UPDATE awa.receipts SET claimed_at = now() - interval '1 hour'")
    last = await pool.fetchval("SELECT now() - interval '30 minutes'")
    await pool.execute(beat, *attempt(a), last)
    await pool.execute(beat, *attempt(b), await pool.fetchval("SELECT now()"))
    assert await pool.fetchval("SELECT awa.ring_rescue('1 minute', 100)") == 1
    rescued = await pool.fetchrow("SELECT state, run_lease, heartbeat_at FROM awa.jobs "
                                  "WHERE id = $1", a["id"])
    assert dict(rescued) == {"state": "running", "run_lease": a["run_lease"],
                             "heartbeat_at": last}
    assert await pool.fetchval(CLOSE, *attempt(a)) is None  # the late completion: nothing
    assert await pool.fetchval(CLOSE, *attempt(b)) is not None
    assert await pool.fetchval("SELECT awa.ring_rescue('0 s', 100)") == 0
    # Past its deadline, an attempt is rescued whatever its heartbeats say.
    (c_id,) = await ring(pool)
    (c,) = await pool.fetch("SELECT * FROM awa.claim('q', 1, 0.01, 0)")
    await asyncio.sleep(0.05)
    await pool.execute(beat, *attempt(c), await pool.fetchval("SELECT now()"))
    assert await pool.fetchval("SELECT awa.ring_rescue('1 hour', 100)") == 1
    assert await pool.fetchval("SELECT state FROM awa.jobs WHERE id = $1", c_id) == "running"


async def test_an_unreadied_job_is_claimed_once_from_the_mutable_lane(pool: asyncpg.Pool) -> None:
    one, two, three = await ring(pool, 3)
    assert await pool.fetchval(UNREADY, [two]) == [two]
    assert await pool.fetchval(UNREADY, [two]) == []  # moved once
    moved = await pool.fetchrow("SELECT state, run_lease, kind FROM awa.jobs WHERE id = $1", two)
    assert dict(moved) == {"state": "available", "run_lease": 0, "kind": "k"}
    rows = await claim(pool, 10)
    assert sorted((r["id"], r["receipt_slot"] is None) for r in rows) == [
        (one, False), (two, True), (three, False)]
    assert await pool.fetchval(UNREADY, [one]) == []  # claimed already: stays a ring attempt
    assert await claim(pool, 10) == []
    four = await ring(pool)  # the ring moves on and never returns the moved job again
    assert [r["id"] for r in await claim(pool, 10)] == four
    assert await claim(pool, 10) == []


async def test_a_claim_returns_the_rows_it_walked_past_unreadied_ones(
        pool: asyncpg.Pool) -> None:
    """A claim that takes part of a lane, with unreadied rows among those it walked
    (migration 0023 returns the walked rows themselves), hands out each job once,
    in order, with its own payload, and the rest on the next claim."""
    ids = [r["id"] for r in await pool.fetch(
        "INSERT INTO awa.ready (queue, priority, kind, args, max_attempts, tags) "
        "SELECT 'q', 2, 'k' || g, jsonb_build_object('n', g), 5, array['t' || g] "
        "FROM generate_series(1, 6) g RETURNING id")]
    assert await pool.fetchval(UNREADY, [ids[1], ids[3]]) == [ids[1], ids[3]]
    moved = [r["id"] for r in await pool.fetch(  # out of the ring: the mutable lane's now
        "DELETE FROM awa.jobs WHERE id = ANY($1) RETURNING id", [ids[1], ids[3]])]
    assert sorted(moved) == [ids[1], ids[3]]
    first = await claim(pool, 2)
    assert [(r["id"], r["kind"], r["args"], r["tags"], r["attempt"], r["run_lease"])
            for r in first] == [(ids[n], f"k{n + 1}", f'{{"n": {n + 1}}}', [f"t{n + 1}"], 1, 1)
                                for n in (0, 2)]
    assert all(r["receipt_slot"] == 0 for r in first)
    assert [r["id"] for r in await claim(pool, 10)] == [ids[4], ids[5]]
    assert await claim(pool, 10) == []
    assert await pool.fetchval("SELECT count(*) FROM awa.receipts") == 4


async def test_a_slot_is_truncated_only_when_everything_in_it_is_spent(
        pool: asyncpg.Pool) -> None:
    first_id, _, _, unreadied = await ring(pool, 4)  # into slot 0
    assert await pool.fetchval(UNREADY, [unreadied]) == [unreadied]  # ready_cancels: slot 0
    first = await claim(pool, 1)  # its receipt in slot 0
    await move_ring_to(pool, 2)
    # The first attempt is still open: it moves to the mutable lane. The other jobs
    # are not claimed yet, so the ready rows (and cancels) stay, and so do the
    # receipts (a receipt outlives its ready row). The tick moves to slot 2.
    assert await reclaim_slot(pool, 0) == ["claim_log"]
    assert await pool.fetchval("SELECT state FROM awa.jobs WHERE id = $1", first_id) == "running"

    rest = [r for r in await claim(pool, 10) if r["receipt_slot"] is not None]
    assert len(rest) == 2
    # Every job is claimed, but two attempts (receipts in slot 2) still read their
    # ready rows: nothing goes.
    assert await reclaim_slot(pool, 0) == []
    for r in rest:
        await pool.fetchval(CLOSE, *attempt(r))
    assert await reclaim_slot(pool, 0) == ["ready", "ready_cancels", "receipts", "closures"]
    assert await pool.fetchval("SELECT count(*) FROM awa.ready_0") == 0
    assert await pool.fetchval(CLOSE, *attempt(first[0])) is None  # a late closure: nothing

    # A producer still writing into a slot whose committed rows are all spent holds
    # reclaiming off until it commits, and then its job is not truncated but claimed.
    await move_ring_to(pool, 3)
    await ring(pool)
    (spent,) = await claim(pool, 1)
    assert await pool.fetchval(CLOSE, *attempt(spent)) == 1
    async with pool.acquire() as open_producer:
        tr = open_producer.transaction()
        await tr.start()
        (late,) = await ring(open_producer)
        await move_ring_to(pool, 0)  # round the ring (4 slots)
        await claim(pool, 1)
        with pytest.raises(asyncpg.LockNotAvailableError):
            await reclaim_slot(pool, 3)
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = '30s'")
            waiting = asyncio.create_task(conn.fetchval(
                "SELECT awa.ring_reclaim('ready', 3::smallint)"))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            # Migration 0026: while the reclaim waits to look under the lock, and
            # while it looks, only writers into the table are kept out: readers of
            # the ring and claims go on (0024's ACCESS EXCLUSIVE queued them all).
            async with pool.acquire() as other, other.transaction():
                await other.execute("SET LOCAL statement_timeout = '10s'")
                assert await other.fetchval("SELECT count(*) FROM awa.ready_3") == 1
                assert await claim(other, 1) == []  # the late job is not committed yet
            assert not waiting.done()
            await tr.commit()
            assert await waiting is False
    assert [r["id"] for r in await claim(pool)] == [late]


async def test_a_table_not_spent_is_left_without_waiting_for_its_lock(
        pool: asyncpg.Pool) -> None:
    """A reclaim looks before it locks (migration 0023): a reader holding an old
    slot's table keeps its reclaim waiting only once the table is spent, so the
    claims and completions queued behind that lock request never wait for a
    table that could not have been truncated anyway."""
    (job,) = await ring(pool)
    await move_ring_to(pool, 1)
    async with pool.acquire() as reader, reader.transaction(isolation="repeatable_read"):
        assert await reader.fetchval("SELECT count(*) FROM awa.ready_0") == 1  # holds its lock
        assert not await reclaim(pool, "ready", 0)  # not claimed yet: no lock asked for
        (claimed,) = await claim(pool, 1)
        assert await pool.fetchval(CLOSE, *attempt(claimed)) == 1
        await claim(pool, 1)  # every lane's cursor past it: spent, so the lock is needed
        with pytest.raises(asyncpg.LockNotAvailableError):
            await reclaim(pool, "ready", 0)
    assert await reclaim(pool, "ready", 0)
    assert claimed["id"] == job


async def test_a_table_a_long_transaction_holds_is_not_asked_for_until_it_ends(
        pool: asyncpg.Pool) -> None:
    """Each ask for a held table's lock queues claims behind it until the lock
    timeout. The ring's keeper asks for a spent table once; if the same
    transaction still holds it at the next pass, it leaves the table alone
    until that transaction has ended, then truncates it."""
    keeper = RingKeeper(pool, queries(), timedelta(seconds=30), lambda: True)
    keeper.attempts, keeper.retry_seconds = 1, 0.0
    await ring(pool)
    (claimed,) = await claim(pool, 1)
    assert await pool.fetchval(CLOSE, *attempt(claimed)) == 1
    await move_ring_to(pool, 1)
    await claim(pool, 1)  # every lane's cursor past slot 0: its ready row is spent
    async with pool.acquire() as reader, reader.transaction(isolation="repeatable_read"):
        assert await reader.fetchval("SELECT count(*) FROM awa.ready_0") == 1
        await keeper.reclaim()  # asks for ready_0 and cannot have it
        assert keeper.deferred == 0
        await keeper.reclaim()  # the same transaction still holds it: not asked
        await keeper.reclaim()
        assert keeper.deferred == 2
        assert await pool.fetchval("SELECT count(*) FROM awa.ready_0") == 1
    await keeper.reclaim()
    assert keeper.deferred == 2
    assert await pool.fetchval("SELECT count(*) FROM awa.ready_0") == 0


async def test_the_keeper_looks_again_at_the_slot_just_left_after_a_turn(
        pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The slot just left is kept while the attempts in flight at the turn are
    open; the keeper looks at it again a moment later in the same pass rather
    than a whole pass later, and stops looking once it is truncated (or after
    its few looks, if an attempt stays open)."""
    keeper = RingKeeper(pool, queries(), timedelta(seconds=30), lambda: True)
    keeper.attempts, keeper.retry_seconds, keeper.settle_seconds = 1, 0.0, (1.0, 2.0, 4.0)
    await ring(pool)
    (in_flight,) = await claim(pool, 1)  # receipt slot 0

    async def finish_soon() -> None:
        for _ in range(3000):  # the turn, and a first look that kept slot 0
            if keeper.left_held:
                break
            await asyncio.sleep(0.01)
        assert await pool.fetchval(CLOSE, *attempt(in_flight)) == 1
        await claim(pool, 1)  # a tick past the ready row

    finishing = asyncio.create_task(finish_soon())
    await keeper.run_once()  # turns into slot 1, finds slot 0 open, looks again
    await finishing
    assert await pool.fetchval("SELECT awa.ring_slot()") == 1
    assert await pool.fetchval("SELECT count(*) FROM awa.ring_occupied() WHERE slot = 0") == 0
    assert not keeper.left_held

    await ring(pool)
    (stays,) = await claim(pool, 1)  # receipt slot 1, open throughout the pass
    keeper.settle_seconds = (0.1, 0.1)
    asked: list[tuple[str, int]] = []
    reclaim_one = keeper._reclaim_one

    async def asking(family: str, slot: int) -> bool:
        asked.append((family, slot))
        return await reclaim_one(family, slot)

    monkeypatch.setattr(keeper, "_reclaim_one", asking)
    await keeper.run_once()  # turns into 2; slot 1 kept through every look
    assert await pool.fetchval("SELECT awa.ring_slot()") == 2
    assert keeper.left_held
    # Kept at each of its three looks, the receipts too (answered without a
    # count while the ready rows are there: test below).
    assert asked.count(("ready", 1)) == 3 and asked.count(("receipts", 1)) == 3, asked
    assert await pool.fetchval("SELECT count(*) FROM awa.receipts WHERE slot = 1") == 1
    assert await pool.fetchval(CLOSE, *attempt(stays)) == 1


async def turn_to(pool: asyncpg.Pool, slot: int) -> None:
    """A turn of the ring straight to ``slot`` (migration 0024's record of turns)."""
    await pool.execute("INSERT INTO awa.ring_turns (n, slot) "
                       "SELECT max(n) + 1, $1 FROM awa.ring_turns", slot)


async def test_the_ring_advances_only_into_an_empty_slot(pool: asyncpg.Pool) -> None:
    await move_ring_to(pool, 3)
    await turn_to(pool, 0)
    await ring(pool)  # slot 0 in use
    await turn_to(pool, 3)
    assert await pool.fetchval("SELECT awa.ring_advance()") is None
    assert await pool.fetchval("SELECT awa.ring_slot()") == 3
    assert not await reclaim(pool, "receipts", 3)  # the slot being written is never reclaimed


async def test_a_turn_of_the_ring_is_a_new_row_and_no_row_changes(pool: asyncpg.Pool) -> None:
    """Migration 0024: turning the ring updates nothing, so a held horizon keeps no
    dead row versions of it (0020 updated awa.ring's one row every turn)."""
    config = await pool.fetchval("SELECT xmin::text FROM awa.ring_config")
    await move_ring_to(pool, 3)
    turns = await pool.fetch("SELECT n, slot, xmin::text AS x FROM awa.ring_turns ORDER BY n")
    assert [(t["n"], t["slot"]) for t in turns] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    await move_ring_to(pool, 0)  # round again: slot 0 from turn 4
    assert await pool.fetchval("SELECT awa.ring_slot()") == 0
    assert await pool.fetchval("SELECT max(n) FROM awa.ring_turns") == 4
    # No turn was rewritten, nor the settings row; awa.ring still reads as 0020's row.
    again = await pool.fetch("SELECT xmin::text AS x FROM awa.ring_turns WHERE n <= 3 ORDER BY n")
    assert [t["x"] for t in again] == [t["x"] for t in turns]
    assert await pool.fetchval("SELECT xmin::text FROM awa.ring_config") == config
    row = await pool.fetchrow("SELECT slot, slots, enqueue FROM awa.ring")
    assert (row["slot"], row["slots"]) == (0, 4)
    await pool.execute("UPDATE awa.ring SET enqueue = NOT enqueue")  # the old switch still works
    assert await pool.fetchval("SELECT enqueue FROM awa.ring_config") is not row["enqueue"]


async def test_a_session_sees_each_turn_of_the_ring_at_its_next_statement(
        pool: asyncpg.Pool) -> None:
    """Migration 0033: awa.ring_slot() keeps its plan for the session, never its
    answer: a session that asked before sees a turn committed elsewhere at its
    next statement, in single inserts (the slot's default) and in its own
    reads; within one statement the answer holds still (STABLE)."""
    # PL/pgSQL keeps the plan of its query for the session (a SQL function
    # reading a table is planned again by every statement calling it).
    assert await pool.fetchval(
        "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
        " WHERE p.oid = 'awa.ring_slot()'::regprocedure") == "plpgsql"
    async with pool.acquire() as reader, pool.acquire() as other:
        for _ in range(3):  # planned and reused by now
            assert await reader.fetchval("SELECT awa.ring_slot()") == 0
        for slot in (1, 2, 3, 0):
            assert await other.fetchval("SELECT awa.ring_advance()") is not None
            assert await reader.fetchval("SELECT awa.ring_slot()") == slot
            got = await reader.fetchval(
                "INSERT INTO awa.ready (kind, queue, args, priority, max_attempts)"
                " VALUES ('k', 'q', '{}', 2, 25) RETURNING slot")
            assert got == slot
        async with reader.transaction():
            before = await reader.fetchval("SELECT awa.ring_slot()")
            one = await reader.fetch(
                "SELECT awa.ring_slot() AS s, pg_sleep(0.02) FROM generate_series(1, 3)")
            assert {r["s"] for r in one} == {before}


async def test_two_turns_at_once_make_one(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as a, pool.acquire() as b:
        async with a.transaction():
            assert await a.fetchval("SELECT awa.ring_advance()") == 1
            # b waits for a's turn 1 to commit, then finds it taken: no second turn.
            racing = asyncio.ensure_future(b.fetchval("SELECT awa.ring_advance()"))
            await asyncio.sleep(0.2)
            assert not racing.done()
        assert await racing is None
    assert await pool.fetchval("SELECT count(*) FROM awa.ring_turns") == 2
    assert await pool.fetchval("SELECT awa.ring_slot()") == 1


async def test_turns_older_than_a_day_are_deleted_every_1440_turns(pool: asyncpg.Pool) -> None:
    await pool.execute("UPDATE awa.ring_turns SET at = now() - interval '3 days'")  # turn 0
    await pool.execute("""INSERT INTO awa.ring_turns (n, slot, at)
                          SELECT g, g % 4, now() - interval '2 days' + g * interval '1 s'
                          FROM generate_series(1, 1434) g""")
    await pool.execute("INSERT INTO awa.ring_turns (n, slot) SELECT g, g % 4 "
                       "FROM generate_series(1435, 1438) g")  # the last few: recent
    assert await pool.fetchval("SELECT awa.ring_advance()") == 3  # turn 1439: no sweep
    assert await pool.fetchval("SELECT count(*) FROM awa.ring_turns") == 1440
    assert await pool.fetchval("SELECT awa.ring_advance()") == 0  # turn 1440: sweep
    assert await pool.fetchval("SELECT min(n) FROM awa.ring_turns") == 1435
    assert await pool.fetchval("SELECT awa.ring_slot()") == 0


async def test_a_long_attempt_moves_to_the_mutable_lane_so_its_slot_can_go(
        pool: asyncpg.Pool) -> None:
    await ring(pool)  # slot 0
    (job,) = await claim(pool)  # its receipt in slot 0 too
    await move_ring_to(pool, 2)
    await claim(pool)  # a tick after, in slot 2
    assert not await reclaim(pool, "ready", 0)  # its attempt is open
    assert not await reclaim(pool, "receipts", 0)  # the attempt moves; its ready row stays
    assert await reclaim(pool, "ready", 0)
    assert await reclaim(pool, "receipts", 0)
    assert await reclaim(pool, "closures", 0)
    # The newest tick (the next claim starts there) moves to slot 2 with the rest.
    assert await reclaim(pool, "claim_log", 0)
    assert await pool.fetchval("SELECT slot FROM awa.claim_log ORDER BY n DESC LIMIT 1") == 2
    assert await pool.fetchval("SELECT count(*) FROM awa.claim_log_0") == 0
    assert await pool.fetchval("SELECT count(*) FROM awa.ready_0") == 0
    # The attempt lives on in the mutable lane, with its run lease and payload.
    moved = await pool.fetchrow("SELECT state, run_lease, kind FROM awa.jobs WHERE id = $1",
                                job["id"])
    assert dict(moved) == {"state": "running", "run_lease": job["run_lease"], "kind": "k"}
    assert await pool.fetchval(CLOSE, *attempt(job)) is None
    assert await claim(pool) == []


async def test_available_counts_what_a_claim_would_find(pool: asyncpg.Pool) -> None:
    assert await pool.fetchval(AVAILABLE, 100) == 0
    second = await ring(pool, 10, 2)
    await ring(pool, 2, 1)
    assert await pool.fetchval(AVAILABLE, 100) == 12
    assert await pool.fetchval(AVAILABLE, 5) == 5
    await claim(pool, 4)  # both of priority 1, the first two of priority 2
    await ring(pool, 1, 3)
    assert await pool.fetchval(UNREADY, [second[4]]) == [second[4]]
    assert await pool.fetchval(AVAILABLE, 100) == 12 + 1 - 4 - 1
    async with pool.acquire() as open_producer, open_producer.transaction():
        await ring(open_producer)
        assert await pool.fetchval(AVAILABLE, 100) == 8  # not committed yet
    assert await pool.fetchval(AVAILABLE, 100) == 9
    rows = await claim(pool, 100)
    assert len([r for r in rows if r["receipt_slot"] is not None]) == 9
    assert [r["id"] for r in rows if r["receipt_slot"] is None] == [second[4]]
    assert await pool.fetchval(AVAILABLE, 100) == 0


async def test_an_idle_queue_is_polled_without_writing(pool: asyncpg.Pool) -> None:
    await ring(pool)
    await mutable(pool)
    assert len(await claim(pool)) == 2
    await claim(pool)  # the lanes catch up with the last tick
    ticks = await pool.fetchval("SELECT count(*) FROM awa.claim_log")
    async with pool.acquire() as conn, conn.transaction():
        for _ in range(5):
            assert await claim(conn, 10) == []
        assert await conn.fetchval("SELECT pg_current_xact_id_if_assigned()") is None
    assert await pool.fetchval("SELECT count(*) FROM awa.claim_log") == ticks
    (job,) = await ring(pool)  # and the next job is still found
    assert [r["id"] for r in await claim(pool)] == [job]


async def test_a_paused_queue_claims_nothing(pool: asyncpg.Pool) -> None:
    jobs = {*await ring(pool), *await mutable(pool)}
    await pool.execute("INSERT INTO awa.queues (queue, paused) VALUES ('q', true)")
    assert await claim(pool, 10) == []
    assert await pool.fetchval(AVAILABLE, 100) == 1  # still there, only not claimed
    await pool.execute("UPDATE awa.queues SET paused = false WHERE queue = 'q'")
    assert {r["id"] for r in await claim(pool, 10)} == jobs


async def test_throughput_counts_are_only_inserted(pool: asyncpg.Pool) -> None:
    """Each flush of a worker's counts adds rows (migration 0022): nothing is updated,
    so a held xmin horizon keeps no dead row versions there; readers sum the rows."""
    from awa.db.queries import Queries

    add = Queries()["throughput_add"]
    for completed, failed in ((3, 1), (4, 0)):
        await pool.execute(add, ["q"], [completed], [failed], 7, [completed], [1.0], [2.0])
    rows = await pool.fetch("SELECT completed, failed, xmax::text FROM awa.queue_throughput "
                            "WHERE queue = 'q' AND shard = 7 ORDER BY completed")
    assert [(r["completed"], r["failed"], r["xmax"]) for r in rows] == [(3, 1, "0"), (4, 0, "0")]
    series = await pool.fetch(Queries()["ui_series"], 5, "q")
    assert [(r["completed"], r["failed"], r["wait_count"]) for r in series] in (
        [(7, 1, 7)], [(3, 1, 3), (4, 0, 4)])  # the two flushes may straddle a minute


# Migration 0023's test of a spent ready slot, which read every row of it and
# every receipt claimed from it: the reference migration 0029's probes must agree with.
READY_SPENT_BY_ROWS = """
SELECT NOT EXISTS (
    SELECT 1 FROM (SELECT DISTINCT w.queue FROM awa.ready w WHERE w.slot = $1) q
    LEFT JOIN LATERAL (
        SELECT c.snap FROM awa.claim_log c
        WHERE c.queue = q.queue
          AND c.n = (SELECT min(t) - 1 FROM (
                         SELECT l.cur_tick FROM awa.claim_log l
                         WHERE l.queue = q.queue ORDER BY l.n DESC LIMIT 1) z,
                     unnest(z.cur_tick) t)
    ) spent ON true
    WHERE spent.snap IS NULL OR EXISTS (
        SELECT 1 FROM awa.ready w
        WHERE w.slot = $1 AND w.queue = q.queue
          AND NOT pg_visible_in_snapshot(w.xid, spent.snap)))
AND NOT EXISTS (
    SELECT 1 FROM awa.receipts r WHERE r.ready_slot = $1 AND NOT EXISTS (
        SELECT 1 FROM awa.closures c
        WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease))"""
# The same, wrongly looking only at the current slot's receipts: the random
# test below must meet states where this differs (an older slot's open attempt).
READY_SPENT_BY_CURRENT_RECEIPTS = READY_SPENT_BY_ROWS.replace(
    "WHERE r.ready_slot = $1 AND", "WHERE r.ready_slot = $1 AND r.slot = awa.ring_slot() AND")
# Migration 0023's test that no ready row a receipt slot's attempts came from
# is left, a join of every receipt: the reference for 0030's, which looks only
# at ready slots that hold rows.
DRAINED_BY_ROWS = """SELECT NOT EXISTS (SELECT 1 FROM awa.receipts r
                      JOIN awa.ready w ON w.slot = r.ready_slot AND w.id = r.id
                                      AND w.lease_base = r.run_lease - 1
                      WHERE r.slot = $1)"""
OPEN_BY_ROWS = """SELECT EXISTS (SELECT 1 FROM awa.receipts r WHERE r.slot = $1 AND NOT EXISTS (
                      SELECT 1 FROM awa.closures c
                      WHERE c.slot = r.slot AND c.id = r.id AND c.run_lease = r.run_lease))"""


async def test_the_spent_tests_by_index_agree_with_reading_every_row(pool: asyncpg.Pool) -> None:
    """Migration 0029 decides that a ready slot is spent by index probes (per lane:
    a row at or past the tick's xmax, or of a transaction running at the tick)
    and that a receipt slot has open attempts by counting; 0030 that the ready
    rows a receipt slot's attempts came from are gone by looking only at ready
    slots that hold rows; 0031's ready test, told which slots are closed and
    taking the current one as open, answers the same. Through producers that
    stay open across claims (their rows belong to a later tick than their ids
    suggest), rollbacks, several lanes, attempts closed in any order, turns of
    the ring and truncated ready slots, all three answer as reading every row
    does, and each answer is seen both ways; some attempts stay open across
    turns, so a ready slot kept only by an older slot's open attempt is met."""
    rng = random.Random(29)
    seen: Counter[tuple[str, bool]] = Counter()
    open_attempts: list[asyncpg.Record] = []
    long_attempts: list[asyncpg.Record] = []
    producers = [await pool.acquire() for _ in range(3)]
    running: dict[int, asyncpg.transaction.Transaction] = {}
    try:
        for step in range(120):
            action = rng.random()
            if action < 0.3:  # a producer inserts, in a transaction left open or not
                k = rng.randrange(len(producers))
                if k not in running:
                    running[k] = producers[k].transaction()
                    await running[k].start()
                await ring(producers[k], rng.randint(1, 5), rng.randint(1, 4))
                if rng.random() < 0.5:
                    tr = running.pop(k)
                    await (tr.rollback() if rng.random() < 0.2 else tr.commit())
            elif action < 0.4 and running:  # an open producer ends
                k = rng.choice(list(running))
                tr = running.pop(k)
                await (tr.rollback() if rng.random() < 0.2 else tr.commit())
            elif action < 0.65:
                for r in await claim(pool, rng.randint(1, 8)):
                    if r["receipt_slot"] is not None:
                        # some run long: open across turns of the ring
                        (long_attempts if rng.random() < 0.25 else open_attempts).append(r)
            elif action < 0.85 and open_attempts:
                for r in rng.sample(open_attempts, rng.randint(1, len(open_attempts))):
                    await pool.fetchval(CLOSE, *attempt(r))
                    open_attempts.remove(r)
            elif action < 0.9 and long_attempts:
                await pool.fetchval(CLOSE, *attempt(long_attempts.pop(0)))
            elif step % 2 == 0 and step >= 30:  # turns once attempts are open
                await pool.fetchval("SELECT awa.ring_advance()")  # into an empty slot only
            else:  # truncate the spent ready slots (receipts may outlive their rows)
                for s in range(4):
                    with contextlib.suppress(asyncpg.LockNotAvailableError):
                        await reclaim(pool, "ready", s)
            closed = [r for r in range(4) if not await pool.fetchval(OPEN_BY_ROWS, r)]
            for s in range(4):
                by_rows = await pool.fetchval(READY_SPENT_BY_ROWS, s)
                assert await pool.fetchval("SELECT awa.ring_ready_spent($1::smallint)", s) \
                    is by_rows, (step, s)
                # 0031: slots the caller counted closed are not counted again
                assert await pool.fetchval("SELECT awa.ring_ready_spent($1::smallint, $2)",
                                           s, closed) is by_rows, (step, s, closed)
                seen["ready", by_rows] += 1
                # kept only by an open attempt claimed in an older slot: a test
                # that looked at the current slot's receipts alone would differ
                seen["older", by_rows is not await pool.fetchval(
                    READY_SPENT_BY_CURRENT_RECEIPTS, s)] += 1
                is_open = await pool.fetchval(OPEN_BY_ROWS, s)
                assert await pool.fetchval("SELECT awa.ring_open($1::smallint)", s) \
                    is is_open, (step, s)
                seen["open", is_open] += 1
                drained = await pool.fetchval(DRAINED_BY_ROWS, s)
                assert await pool.fetchval("SELECT awa.ring_receipts_drained($1::smallint)",
                                           s) is drained, (step, s)
                seen["drained", drained] += 1
    finally:
        for tr in running.values():
            await tr.rollback()
        for conn in producers:
            await pool.release(conn)
    assert all(seen[kind, answer] > 0 for kind in ("ready", "open", "drained")
               for answer in (True, False)), seen
    assert seen["older", True] > 0, seen


async def test_the_slot_just_left_keeps_its_attempts_in_flight(pool: asyncpg.Pool) -> None:
    """Reclaiming the receipts of the slot the ring has just left would move the
    attempts in flight at the turn to the mutable lane (migration 0029 leaves
    them); a turn later, one still open moves, so a long job never pins the ring."""
    (job_id,) = await ring(pool)  # slot 0
    (job,) = await claim(pool)  # its receipt in slot 0
    await move_ring_to(pool, 1)
    await claim(pool)  # a tick after it: every cursor past the ready row
    assert not await reclaim(pool, "ready", 0)
    assert not await reclaim(pool, "receipts", 0)
    assert await pool.fetchval("SELECT count(*) FROM awa.jobs WHERE id = $1", job_id) == 0
    await move_ring_to(pool, 2)
    assert not await reclaim(pool, "receipts", 0)  # moved; its ready row is still there
    assert await pool.fetchval("SELECT state FROM awa.jobs WHERE id = $1", job_id) == "running"
    assert await pool.fetchval(CLOSE, *attempt(job)) is None  # the moved closure came first


async def test_a_long_attempt_in_the_slot_just_left_cannot_pin_the_ring(
        pool: asyncpg.Pool) -> None:
    """An attempt claimed from a ready row two turns older (a backlog) and still
    open at the turn keeps that ready slot, the next the ring must turn into,
    unspent; the slot just left is left alone only for 10 s after the turn
    (0032), then its open attempt moves to the mutable lane and the ring turns.
    Before, the ring stayed pinned for as long as the job ran."""
    (job_id,) = await ring(pool)  # ready slot 0
    await move_ring_to(pool, 2)
    (job,) = await claim(pool, 1)  # its receipt in slot 2
    assert attempt(job)[0] == 2
    await claim(pool)  # a tick past the row
    await move_ring_to(pool, 3)  # slot 2 just left; slot 0 is next
    assert not await reclaim(pool, "receipts", 2)  # the turn is young: left alone
    assert not await reclaim(pool, "ready", 0)  # the open attempt reads its row
    assert await pool.fetchval("SELECT awa.ring_advance()") is None
    assert await pool.fetchval("SELECT count(*) FROM awa.jobs WHERE id = $1", job_id) == 0
    await pool.execute("UPDATE awa.ring_turns SET at = at - interval '11 seconds' "
                       "WHERE n = (SELECT max(n) FROM awa.ring_turns)")
    assert not await reclaim(pool, "receipts", 2)  # moved; its ready row is still there
    assert await pool.fetchval("SELECT state FROM awa.jobs WHERE id = $1", job_id) == "running"
    assert "ready" in await reclaim_slot(pool, 0)
    assert await pool.fetchval("SELECT awa.ring_advance()") == 0
    assert await pool.fetchval(CLOSE, *attempt(job)) is None  # the moved closure came first


async def rows_read(conn: asyncpg.Connection, table: str) -> int:
    """Rows of ``table`` read so far in this transaction (by scans of any kind)."""
    n: int = await conn.fetchval(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
        "FROM pg_stat_xact_user_tables WHERE schemaname = 'awa' AND relname = $1", table)
    return n


async def test_reclaiming_the_slot_just_left_counts_its_attempts_twice_a_table(
        pool: asyncpg.Pool) -> None:
    """The look before the lock reuses the count of the "just left" check, and
    only the look under the lock counts again; the receipts' ready rows are not
    looked for in ready slots newer than theirs (0031). So reclaiming each of
    the ready and receipts tables of the slot just left reads its receipts
    about twice, not three to five times (0.1 s a read of a full slot under
    load), while the current slot holds a job."""
    n = 200
    await ring(pool, n)
    jobs = await claim(pool, n)
    assert len(jobs) == n and all(attempt(j)[0] == 0 for j in jobs)
    for j in jobs:
        await pool.fetchval(CLOSE, *attempt(j))
    await move_ring_to(pool, 1)
    await claim(pool)  # a tick past every ready row
    await ring(pool)  # a job waiting in the current slot, as under load
    for family in ("ready", "receipts"):
        async with pool.acquire() as conn, conn.transaction():
            before = await rows_read(conn, "receipts_0")
            assert await conn.fetchval("SELECT awa.ring_reclaim($1, 0::smallint)", family)
            read = await rows_read(conn, "receipts_0") - before
        # two counts, and for the receipts the two looks' "any row here?" (one each)
        assert 2 * n <= read < 3 * n, (family, read)
    assert await pool.fetchval("SELECT count(*) FROM awa.receipts WHERE slot = 0") == 0


async def test_the_receipts_of_the_slot_just_left_wait_uncounted_while_its_ready_rows_stay(
        pool: asyncpg.Pool) -> None:
    """While the ready table of the slot just left holds rows, reclaiming its
    receipts answers "not yet" from one ready row, reading none of its
    receipts (0032; 0031 counted them all first); once the ready table is
    truncated the receipts go as before."""
    n = 200
    await ring(pool, n)
    jobs = await claim(pool, n)
    for j in jobs:
        await pool.fetchval(CLOSE, *attempt(j))  # every attempt closed
    await move_ring_to(pool, 1)  # no tick past the rows yet: ready slot 0 not spent
    async with pool.acquire() as conn, conn.transaction():
        before = await rows_read(conn, "receipts_0")
        assert not await conn.fetchval("SELECT awa.ring_reclaim('receipts', 0::smallint)")
        assert await rows_read(conn, "receipts_0") == before
    assert not await reclaim(pool, "ready", 0)
    await claim(pool)  # a tick past every ready row
    assert await reclaim(pool, "ready", 0)
    assert await reclaim(pool, "receipts", 0)
    assert await pool.fetchval("SELECT count(*) FROM awa.receipts WHERE slot = 0") == 0


async def test_receipts_outlive_their_ready_rows_only_once_those_are_truncated(
        pool: asyncpg.Pool) -> None:
    """A receipt slot is drained (no ready row its attempts came from is left)
    once the ready slots it read from are truncated, though its receipts are
    still there; a ready row it read in a slot still held keeps it (0030 looks
    only in ready slots that hold rows)."""
    drained = "SELECT awa.ring_receipts_drained(1::smallint)"
    await ring(pool, 2)  # both in ready slot 0
    (first,) = await claim(pool, 1)  # its receipt in slot 0
    await pool.fetchval(CLOSE, *attempt(first))
    await move_ring_to(pool, 1)
    (second,) = await claim(pool, 1)  # receipt slot 1, from ready slot 0
    assert attempt(second)[0] == 1
    await pool.fetchval(CLOSE, *attempt(second))
    assert await pool.fetchval(drained) is False
    assert await pool.fetchval(DRAINED_BY_ROWS, 1) is False
    await claim(pool)  # a tick past both rows
    assert await reclaim(pool, "ready", 0)
    assert await pool.fetchval("SELECT count(*) FROM awa.receipts WHERE slot = 1") == 1
    assert await pool.fetchval(drained) is True
    assert await pool.fetchval(DRAINED_BY_ROWS, 1) is True
    await ring(pool)  # ready slot 1
    (third,) = await claim(pool, 1)
    await pool.fetchval(CLOSE, *attempt(third))
    assert await pool.fetchval(drained) is False  # its ready row is in slot 1, still held
    assert await pool.fetchval(DRAINED_BY_ROWS, 1) is False


async def test_a_row_of_a_transaction_running_at_the_tick_keeps_its_slot(
        pool: asyncpg.Pool) -> None:
    """A producer open while claims pass its slot commits later: its row is in
    no tick the cursors have passed (its transaction is in the running list of
    their snapshots, below their xmax), so the slot is not spent until a claim
    takes the row and the attempt ends."""
    spent = "SELECT awa.ring_ready_spent(0::smallint)"
    async with pool.acquire() as producer:
        tr = producer.transaction()
        await tr.start()
        (late,) = await ring(producer)
        (early,) = await ring(pool)
        (first,) = await claim(pool)
        assert first["id"] == early
        await pool.fetchval(CLOSE, *attempt(first))
        await claim(pool)  # nothing more to take: the cursors pass the tick
        await tr.commit()
    assert await pool.fetchval(spent) is False
    assert await pool.fetchval(READY_SPENT_BY_ROWS, 0) is False
    (second,) = await claim(pool)
    assert second["id"] == late
    assert await pool.fetchval(spent) is False  # its attempt still reads the row
    await pool.fetchval(CLOSE, *attempt(second))
    await claim(pool)
    assert await pool.fetchval(spent) is True
    assert await pool.fetchval(READY_SPENT_BY_ROWS, 0) is True
