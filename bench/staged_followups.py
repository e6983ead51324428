"""Drain-throughput cost of staging one follow-up per job, against staging none.

    python bench/staged_followups.py [--jobs N] [--database-url URL]

Runs with the repo's own ``awa`` (install it first: ``pip install -e .``). Uses a
fresh database ``bench_followups`` on the server of ``--database-url`` (default
``$DATABASE_URL``, else postgresql://postgres@127.0.0.1:5432/postgres). One
worker process, concurrency 32, no-op handlers; each mode is run twice,
alternating, and the better run of each is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import asyncpg

import awa

DB = "bench_followups"


@dataclass
class Trigger:
    seq: int


@dataclass
class FollowUp:
    seq: int


async def _fresh_db(admin_url: str) -> str:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {DB}")
    finally:
        await conn.close()
    return urlunsplit(urlsplit(admin_url)._replace(path="/" + DB))


async def _drain(url: str, jobs: int, stage: bool) -> float:
    client = awa.AsyncClient(url)
    await client.migrate()
    await client.install_queue_storage(reset=True)

    @client.task(Trigger, queue="bench")
    async def handle(job: awa.JobContext) -> None:
        if stage:
            job.enqueue_on_completion(FollowUp(job.args.seq), queue="unserved")

    await client.enqueue_many_copy([Trigger(i) for i in range(jobs)], queue="bench")
    started = time.perf_counter()
    await client.start([("bench", 32)])
    pool = await client.pool()
    while await pool.fetchval("SELECT count(*) FROM awa.jobs WHERE queue = 'bench'"):
        await asyncio.sleep(0.02)
    elapsed = time.perf_counter() - started
    done = await pool.fetchval("SELECT count(*) FROM awa.jobs_done WHERE queue = 'bench' "
                               "AND state = 'completed'")
    follow = await pool.fetchval("SELECT count(*) FROM awa.jobs WHERE queue = 'unserved'")
    await client.close()
    assert done == jobs, f"{done} of {jobs} completed"
    assert follow == (jobs if stage else 0), f"{follow} follow-ups"
    return jobs / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()
    url = await _fresh_db(args.database_url)
    results: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(2):
        for stage in (False, True):
            results[stage].append(await _drain(url, args.jobs, stage))
    none, one = max(results[False]), max(results[True])
    print(f"jobs: {args.jobs}, one worker process, concurrency 32")
    print(f"staging none:            {none:8.0f} jobs/s")
    print(f"staging one follow-up:   {one:8.0f} jobs/s  ({one / none:.2f}x)")


if __name__ == "__main__":
    asyncio.run(main())
