"""Held-xmin experiment for the append-only queue core (issue 42, docs/storage.md).

Runs the prototype in ``schema.sql`` (a scratch schema ``awa_proto``) the way
the harness's idle-in-transaction cell runs a queue: a producer at a fixed
rate, workers claiming and completing, and one transaction that holds the
xmin horizon for the middle phase. Prints one line per 10 s: completions/s,
queue depth, claim p99, and dead tuples summed over the prototype's tables.

    python bench/storage_proto/run.py --rate 800 --hold 600 --workers 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from pathlib import Path

import asyncpg

HERE = Path(__file__).parent
INSERT = """INSERT INTO awa_proto.ready (id, queue, priority, kind, args)
            SELECT nextval('awa_proto.job_id'), 'bench', 2, 'noop', '{}'::jsonb
            FROM generate_series(1, $1)"""
CLAIM = "SELECT * FROM awa_proto.claim('bench', $1)"
COMPLETE = """
WITH c AS (
    INSERT INTO awa_proto.closures (slot, id, run_lease, outcome)
    SELECT s, i, l, 1 FROM unnest($1::smallint[], $2::bigint[], $3::bigint[]) AS u(s, i, l)
    WHERE EXISTS (SELECT 1 FROM awa_proto.receipts r
                  WHERE r.slot = u.s AND r.id = u.i AND r.run_lease = u.l)
    ON CONFLICT DO NOTHING RETURNING id, run_lease
)
INSERT INTO awa_proto.done (id, queue, kind, args, run_lease, created_at)
SELECT r.id, r.queue, r.kind, r.args, c.run_lease, r.created_at
FROM c JOIN unnest($2::bigint[], $4::smallint[]) AS k(id, rs) ON k.id = c.id
CROSS JOIN LATERAL (SELECT * FROM awa_proto.ready w
                    WHERE w.slot = k.rs AND w.id = k.id LIMIT 1) r"""
# closures and heartbeats only after their receipts
FAMILIES = ("receipts", "closures", "heartbeats", "ready", "ready_cancels", "claim_log")
RECLAIM = "SELECT awa_proto.reclaim($1, $2::smallint)"
EMPTY = """SELECT NOT EXISTS (SELECT 1 FROM awa_proto.ready WHERE slot = $1)
                 AND NOT EXISTS (SELECT 1 FROM awa_proto.receipts WHERE slot = $1)
                 AND NOT EXISTS (SELECT 1 FROM awa_proto.claim_log WHERE slot = $1)"""
DEAD = """SELECT coalesce(sum(n_dead_tup), 0)::bigint, coalesce(sum(n_live_tup), 0)::bigint
          FROM pg_stat_user_tables WHERE schemaname = 'awa_proto'"""


class Stats:
    def __init__(self) -> None:
        self.produced = 0
        self.completed = 0
        self.claim_ms: list[float] = []
        self.deadlocks = 0


async def producer(pool: asyncpg.Pool, rate: int, stop: asyncio.Event, st: Stats) -> None:
    tick = 0.01
    owed = 0.0
    nxt = time.monotonic()
    while not stop.is_set():
        owed += rate * tick
        n = int(owed)
        if n:
            owed -= n
            await pool.execute(INSERT, n)
            st.produced += n
        nxt += tick
        await asyncio.sleep(max(0.0, nxt - time.monotonic()))


async def worker(pool: asyncpg.Pool, batch: int, stop: asyncio.Event, st: Stats) -> None:
    async with pool.acquire() as conn:
        claim = await conn.prepare(CLAIM)
        complete = await conn.prepare(COMPLETE)
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                rows = await claim.fetch(batch)
            except asyncpg.DeadlockDetectedError:  # must not happen: counted, then fatal
                st.deadlocks += 1
                raise
            st.claim_ms.append((time.perf_counter() - t0) * 1000)
            if not rows:
                await asyncio.sleep(0.005 + random.random() * 0.005)
                continue
            await complete.fetch([r["receipt_slot"] for r in rows], [r["id"] for r in rows],
                                 [r["run_lease"] for r in rows], [r["ready_slot"] for r in rows])
            st.completed += len(rows)


async def rotate(pool: asyncpg.Pool, every: float, lock_ms: int, stop: asyncio.Event) -> None:
    """Reclaim spent slots (a transaction each, bounded lock wait), then advance the ring."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
        except TimeoutError:
            pass
        async with pool.acquire() as conn:
            cur, k = await conn.fetchrow("SELECT slot, slots FROM awa_proto.ring")
            for j in range(1, k - 1):
                s = (cur + j) % k
                for family in FAMILIES:
                    t0 = time.perf_counter()
                    try:
                        async with conn.transaction():
                            await conn.execute(f"SET LOCAL lock_timeout = '{lock_ms}ms'")
                            did = await conn.fetchval(RECLAIM, family, s)
                    except asyncpg.LockNotAvailableError:
                        print(f"   {family}_{s} busy, left for next time", flush=True)
                        continue
                    if did:
                        ms = (time.perf_counter() - t0) * 1000
                        print(f"   reclaimed {family}_{s} in {ms:.0f} ms", flush=True)
                if await conn.fetchval(EMPTY, s) is not True:
                    break  # oldest first: a slot still in use keeps the newer ones
            nxt = await conn.fetchval("SELECT awa_proto.advance()")
            print(f"   ring at {nxt}" if nxt is not None else "   ring stays", flush=True)


async def hold_xmin(url: str, start: float, length: float, stop: asyncio.Event) -> None:
    await asyncio.sleep(start)
    conn = await asyncpg.connect(url)
    tr = conn.transaction()
    await tr.start()
    await conn.fetchval("SELECT txid_current()")
    print(f"-- holding the xmin horizon for {length:.0f} s", flush=True)
    try:
        await asyncio.wait_for(stop.wait(), length)
    except TimeoutError:
        pass
    await tr.rollback()
    await conn.close()
    print("-- released", flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get("DATABASE_URL",
                                                    "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--rate", type=int, default=800)
    ap.add_argument("--clean", type=float, default=30)
    ap.add_argument("--hold", type=float, default=600)
    ap.add_argument("--recovery", type=float, default=60)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rotate-every", type=float, default=15)
    ap.add_argument("--lock-ms", type=int, default=100,
                    help="how long a TRUNCATE may wait for its lock (claims wait behind it)")
    ap.add_argument("--drain", type=int, default=0,
                    help="instead: insert this many jobs (1,000 per transaction), then time "
                         "the workers draining them, and the WAL per job of each part")
    ap.add_argument("--out", help="write the samples as JSON here")
    ns = ap.parse_args()
    admin = await asyncpg.connect(ns.url)
    await admin.execute((HERE / "schema.sql").read_text())
    if ns.drain:
        await drain(ns, admin)
        await admin.close()
        return
    pool = await asyncpg.create_pool(ns.url, min_size=ns.workers + 2, max_size=ns.workers + 4)
    stop = asyncio.Event()
    st = Stats()
    total = ns.clean + ns.hold + ns.recovery
    tasks = [asyncio.create_task(producer(pool, ns.rate, stop, st)),
             asyncio.create_task(rotate(pool, ns.rotate_every, ns.lock_ms, stop)),
             asyncio.create_task(hold_xmin(ns.url, ns.clean, ns.hold, stop))]
    tasks += [asyncio.create_task(worker(pool, ns.batch, stop, st)) for _ in range(ns.workers)]
    samples = []
    began = time.monotonic()
    last_done = 0
    while time.monotonic() - began < total:
        await asyncio.sleep(10)
        lat = sorted(st.claim_ms)
        st.claim_ms = []
        p99 = lat[int(len(lat) * 0.99)] if lat else 0.0
        dead, live = await admin.fetchrow(DEAD)
        row = dict(t=round(time.monotonic() - began),
                   completed_per_s=(st.completed - last_done) / 10,
                   depth=st.produced - st.completed, claim_p99_ms=round(p99, 2),
                   claims=len(lat), dead_tuples=dead, live_tuples=live)
        last_done = st.completed
        samples.append(row)
        print(json.dumps(row), flush=True)
    stop.set()
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(result, BaseException):
            print("task failed:", repr(result), flush=True)
    await pool.close()
    await admin.close()
    if ns.out:
        Path(ns.out).write_text(json.dumps(samples, indent=1))
    print(summary(samples, ns.clean, ns.clean + ns.hold, ns.rate))


async def drain(ns: argparse.Namespace, admin: asyncpg.Connection) -> None:
    """Insert ``ns.drain`` jobs, then drain them with ``ns.workers`` claimers: jobs/s and
    WAL bytes per job for the inserts and for claim + complete."""
    wal = "SELECT pg_current_wal_insert_lsn()"
    lsn0 = await admin.fetchval(wal)
    for _ in range(ns.drain // 1000):
        await admin.execute(INSERT, 1000)
    lsn1 = await admin.fetchval(wal)
    pool = await asyncpg.create_pool(ns.url, min_size=ns.workers, max_size=ns.workers + 1)
    st, stop = Stats(), asyncio.Event()
    began = time.perf_counter()
    tasks = [asyncio.create_task(worker(pool, ns.batch, stop, st)) for _ in range(ns.workers)]
    while st.completed < ns.drain // 1000 * 1000:
        await asyncio.sleep(0.01)
    took = time.perf_counter() - began
    stop.set()
    await asyncio.gather(*tasks)
    lsn2 = await admin.fetchval(wal)
    n = st.completed
    lat = sorted(st.claim_ms)
    print(f"drain of {n} jobs by {ns.workers} claimers (batch {ns.batch}): {n / took:,.0f} jobs/s; "
          f"claim statement p50 {lat[len(lat) // 2]:.2f} ms; "
          f"WAL per job: insert {(lsn1 - lsn0) / n:,.0f} B, claim + complete "
          f"{(lsn2 - lsn1) / n:,.0f} B")
    await pool.close()


def summary(samples: list[dict], hold_from: float, hold_to: float, rate: int) -> str:
    """One markdown row per phase: medians of the 10 s samples, and the peaks."""
    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2] if xs else 0.0
    out = ["| phase | completions/s, median | depth, median / peak | claim p99 ms, "
           "median / peak | dead tuples, peak |", "|---|---:|---:|---:|---:|"]
    for name, lo, hi in (("clean", 0, hold_from), ("held xmin", hold_from, hold_to),
                         ("recovery", hold_to, 1e9)):
        rows = [r for r in samples if lo < r["t"] <= hi]
        if not rows:
            continue
        out.append(f"| {name} ({len(rows) * 10} s, {rate}/s offered) "
                   f"| {med([r['completed_per_s'] for r in rows]):.0f} "
                   f"| {med([r['depth'] for r in rows]):.0f} / {max(r['depth'] for r in rows)} "
                   f"| {med([r['claim_p99_ms'] for r in rows]):.1f} / "
                   f"{max(r['claim_p99_ms'] for r in rows):.1f} "
                   f"| {max(r['dead_tuples'] for r in rows)} |")
    return "\n".join(out)


if __name__ == "__main__":
    asyncio.run(main())
