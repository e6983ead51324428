#!/usr/bin/env python3
"""What leadership and presence leave behind while a transaction holds the xmin horizon.

    python bench/presence_hold.py --minutes 35 --out bench/results/presence_hold_after.json

One idle worker process (one queue, default intervals: the lease renewed every
third of 5 s, presence every 2 s) on a fresh database, beside a REPEATABLE READ
transaction that holds the horizon for the whole run. Every --sample-s it
reads, for the tables leadership and presence use (awa.leader and
awa.runtime_instances before migration 0028; the partitions of
awa.leader_terms and awa.presence_beats from it), live and dead tuples and
total size. Run it on the commit before 0028 too (PYTHONPATH=<its src>) to
compare; the results of both are in results/presence_hold.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import asyncpg
from run import db_url  # bench/run.py (this script's directory is on sys.path)

import awa

SAMPLE = """
SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid) AS bytes
FROM pg_stat_user_tables
WHERE schemaname = 'awa' AND (relname IN ('leader', 'runtime_instances')
      OR relname LIKE 'leader\\_terms\\__' OR relname LIKE 'presence\\_beats\\__')
ORDER BY relname"""


async def main(a: argparse.Namespace) -> None:
    admin = await asyncpg.connect(a.database_url)
    await admin.execute(f'DROP DATABASE IF EXISTS "{a.db}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{a.db}"')
    await admin.close()
    url = db_url(a.database_url, a.db)
    await awa.migrate(url)
    client = awa.AsyncClient(url)

    @client.task("noop")
    async def noop(job: awa.Job) -> None:
        return None

    horizon = await asyncpg.connect(url)
    await horizon.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    await horizon.fetchval("SELECT txid_current()")
    probe = await asyncpg.connect(url)
    await client.start([("default", 2)])
    samples = []
    start = time.monotonic()
    try:
        while time.monotonic() - start < a.minutes * 60:
            await asyncio.sleep(a.sample_s)
            rows = await probe.fetch(SAMPLE)
            held = await probe.fetchval(
                "SELECT extract(epoch FROM now() - xact_start) FROM pg_stat_activity "
                "WHERE backend_xid IS NOT NULL AND state = 'idle in transaction' LIMIT 1")
            samples.append({"minute": round((time.monotonic() - start) / 60, 2),
                            "horizon_held_s": held,
                            "tables": {r["relname"]: dict(r) for r in rows}})
            live = sum(r["n_live_tup"] for r in rows)
            dead = sum(r["n_dead_tup"] for r in rows)
            print(f"{samples[-1]['minute']:5.1f} min: live {live}, dead {dead}, "
                  f"{sum(r['bytes'] for r in rows) // 1024} kB", flush=True)
    finally:
        await client.shutdown()
        await client.close()
        await horizon.close()
        await probe.close()
    Path(a.out).write_text(json.dumps({"awa": awa.__version__, "schema":
                                       awa.current_migration_version(), "samples": samples},
                                      indent=1, default=str) + "\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--db", default="bench_presence_hold")
    p.add_argument("--minutes", type=float, default=35)
    p.add_argument("--sample-s", type=float, default=60)
    p.add_argument("--out", required=True)
    asyncio.run(main(p.parse_args()))
