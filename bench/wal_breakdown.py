"""Where the WAL of a drain goes: per record type and per relation (pg_walinspect).

Bulk-inserts N no-op jobs (untimed, as run.py's drain-1w), then drains them
with one worker at concurrency 32, and reads every WAL record written between
"go" and the worker's shutdown with pg_walinspect (PostgreSQL 15+). Prints
bytes per job by resource manager / record type and by relation. WAL is
server-wide: run it on a quiet server (a private one is best) or the figures
include other databases' writes (their records are listed apart).

    .venv/bin/python bench/wal_breakdown.py --database-url postgresql://postgres@127.0.0.1:5499/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections import defaultdict
from dataclasses import dataclass

import asyncpg

import awa

QUEUE = "bench"


@dataclass
class BenchJob:
    seq: int
    sent_at: float = 0.0


def _db_url(admin_url: str, db: str) -> str:
    base, _, _ = admin_url.rpartition("/")
    return f"{base}/{db}"


async def _drain(url: str, n: int, concurrency: int) -> None:
    done = asyncio.Event()
    seen = 0
    client = awa.AsyncClient(url, max_connections=10)

    @client.task(BenchJob, queue=QUEUE)
    async def handle(job: awa.Job) -> None:
        nonlocal seen
        seen += 1
        if seen >= n:
            done.set()

    await client.start(queues=[(QUEUE, concurrency)])
    await done.wait()
    await client.shutdown(timeout_ms=5000)
    await client.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5499/postgres")
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--db", default="bench_walprobe")
    ap.add_argument("--checkpoint", action="store_true",
                    help="CHECKPOINT after the insert (the drain then pays full-page images)")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--sql", action="append", default=[],
                    help="extra SQL run after migrating (an experiment), repeatable")
    args = ap.parse_args()

    admin = await asyncpg.connect(args.database_url)
    await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    await admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{args.db}"')
    url = _db_url(args.database_url, args.db)

    setup = awa.AsyncClient(url, max_connections=2)
    await setup.migrate()
    if args.sql:
        conn = await asyncpg.connect(url)
        for stmt in args.sql:
            await conn.execute(stmt)
        await conn.close()
    await setup.enqueue_many_copy([BenchJob(seq=i) for i in range(args.jobs)], queue=QUEUE)
    await setup.close()
    db = await asyncpg.connect(url)
    await db.execute("ANALYZE")
    if args.checkpoint:
        await admin.execute("CHECKPOINT")
    dboid = await db.fetchval("SELECT oid FROM pg_database WHERE datname = current_database()")

    start = await admin.fetchval("SELECT pg_current_wal_lsn()")
    t0 = time.perf_counter()
    await _drain(url, args.jobs, 32)
    elapsed = time.perf_counter() - t0
    end = await admin.fetchval("SELECT pg_current_wal_lsn()")
    total = await admin.fetchval("SELECT pg_wal_lsn_diff($1, $2)", end, start)

    rows = await admin.fetch(
        "SELECT resource_manager, record_type, record_length, fpi_length, block_ref, xid "
        "FROM pg_get_wal_records_info($1, $2)", start, end)
    names = {r["relfilenode"]: r["relname"] for r in await db.fetch(
        "SELECT pg_relation_filenode(c.oid) AS relfilenode, "
        "n.nspname || '.' || c.relname AS relname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE pg_relation_filenode(c.oid) IS NOT NULL")}
    await db.close()
    await admin.close()

    by_type: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0])
    by_rel: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0])
    rec_total = 0
    for r in rows:
        refs = re.findall(r"rel (\d+)/(\d+)/(\d+)", r["block_ref"] or "")
        rel = "(no block)"
        if refs:
            _, dbo, node = refs[0]
            rel = names.get(int(node), f"rel {node}") if int(dbo) == dboid else f"other db {dbo}"
        key = f"{r['resource_manager']}/{r['record_type']}"
        for agg, k in ((by_type, key), (by_rel, f"{rel}  {key}")):
            agg[k][0] += 1
            agg[k][1] += r["record_length"]
            agg[k][2] += r["fpi_length"]
        rec_total += r["record_length"]

    n = args.jobs
    print(f"drain of {n} jobs in {elapsed:.2f}s ({n / elapsed:,.0f} jobs/s); "
          f"WAL {total / n:.1f} B/job (lsn diff), records {rec_total / n:.1f} B/job, "
          f"{len(rows) / n:.2f} records/job (the rest is page padding / headers)")
    for title, agg in (("by record type", by_type), ("by relation and record type", by_rel)):
        print(f"\n{title}: records/job, bytes/job (of which FPI)")
        for k, (c, b, f) in sorted(agg.items(), key=lambda kv: -kv[1][1])[: args.top]:
            print(f"  {k:<70} {c / n:6.3f} {b / n:8.1f} {f / n:8.1f}")


if __name__ == "__main__":
    asyncio.run(main())
