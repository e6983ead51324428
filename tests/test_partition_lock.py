"""Making a finished-jobs partition never holds completions behind a long reader.

Creating an hourly partition locks awa.jobs_done, which every completion
inserts into. Queued behind a long reader of awa.jobs_done (a report, a
count), that lock request made every completion wait for the reader's whole
run (30 s in the held-xmin harness cell at 2,000 jobs/s). Now the cleanup
service gives the lock `PARTITION_LOCK_TIMEOUT` and makes the partition on a
later pass.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg

import awa
from awa.db.queries import queries
from awa.maintenance.services import Cleaner

PARTITIONS = """SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'awa.jobs_done'::regclass"""


async def test_a_partition_waits_for_no_long_reader(client: awa.AsyncClient,
                                                    conn: asyncpg.Connection,
                                                    database_url: str) -> None:
    pool = await client.pool()
    # A retention no partition exists for yet: the pass has hours to make.
    cleaner = Cleaner(pool, queries(), timedelta(minutes=1), lambda: True,
                      retentions=[timedelta(days=9)], batch_size=100,
                      dlq_retention=timedelta(days=30))
    before = await conn.fetchval(PARTITIONS)
    reader = await asyncpg.connect(database_url)
    try:
        await reader.execute("BEGIN")
        await reader.fetchval("SELECT count(*) FROM awa.jobs_done")  # holds its lock
        async with pool.acquire() as c:
            # Returns at once (a lock wait would last until the reader ends).
            await asyncio.wait_for(cleaner._ensure_partitions(c), timeout=10)
        assert await conn.fetchval(PARTITIONS) == before
    finally:
        await reader.execute("ROLLBACK")
        await reader.close()
    async with pool.acquire() as c:
        await cleaner._ensure_partitions(c)
    assert await conn.fetchval(PARTITIONS) > before
