"""Helpers for one-process benchmark trials: a throwaway database, CPU spent."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any


@asynccontextmanager
async def scratch_database(admin: str, db: str) -> AsyncIterator[str]:
    """Create database ``db`` through ``admin`` (a URL), yield its URL, drop it after."""
    import asyncpg

    conn = await asyncpg.connect(admin)
    await conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    await conn.execute(f'CREATE DATABASE "{db}"')
    await conn.close()
    try:
        yield admin.rsplit("/", 1)[0] + "/" + db
    finally:
        conn = await asyncpg.connect(admin)
        await conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await conn.close()

async def noop_client(url: str) -> Any:
    """A client of the migrated database with a no-op ``bench_job`` task on queue ``bench``."""
    import awa

    await awa.migrate(url)
    client = awa.AsyncClient(url)

    @client.task(kind="bench_job", queue="bench")
    async def handle(job: object) -> None:
        return None

    return client


async def own_cpu(side: Any) -> dict[int, float]:
    """CPU milliseconds used so far by this process and by the server processes of
    its database (/proc; the side connection's own are left out): per job, a
    figure that moves much less than the rate with the load of other processes."""
    pids = await side.fetch("SELECT pid FROM pg_stat_activity WHERE datname = "
                            "current_database() AND pid <> pg_backend_pid()")
    out = {0: sum(os.times()[:2]) * 1000}
    for (pid,) in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")
    return out


async def wait_drained(side: Any, jobs: int, poll_s: float = 0.01) -> None:
    """Return once ``jobs`` outcomes are in ``awa.jobs_done``.

    Completion batches write there directly, whichever lane a job came from, so
    this works on the append-only ring (where ``awa.jobs`` is empty from the
    start) as on the mutable table. One count of one table every ``poll_s``
    keeps the poll's own server CPU small in a CPU-bound drain."""
    import asyncio

    while await side.fetchval("SELECT count(*) FROM awa.jobs_done") < jobs:
        await asyncio.sleep(poll_s)
