"""Hot-path costs of awaitable results and producer backpressure.

    python bench/backpressure.py [--database-url URL] [--jobs 20000] [--rounds 3]

Measures, on a database of its own (``bench_results_bp``, dropped and
recreated):

1. ``insert`` one at a time with ``backpressure="off"``, ``"signal"`` and
   ``Reject(limit)``, into an empty queue and behind backlogs of 10,000 and
   100,000 available jobs (µs per insert, median of rounds);
2. the depth count alone (``client.queue_depth``) for caps 1,000 / 10,000 /
   100,000 at a 100,000-job backlog;
3. the server time of a finishing statement (1 or 32 jobs moved from
   awa.jobs to awa.jobs_done) with the finished-row trigger that wakes
   waiters (0018; it also releases dependents) disabled, enabled with nobody
   waiting, and with 100 / 1,000 waiters parked on other jobs;
4. a one-worker drain (concurrency 32, no-op handler) with the trigger
   disabled, enabled with nobody waiting, and with 100 waiters parked.

The drain with no waiters against main is `bench/run.py --systems awa
--scenarios drain-1w` run on both trees (bench/results/results_backpressure.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import asyncpg

import awa

DB = "bench_results_bp"


def _db_url(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


async def _reset(admin_url: str) -> str:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{DB}"')
    finally:
        await conn.close()
    url = _db_url(admin_url, DB)
    await awa.migrate(url)
    return url


async def _backlog(client: awa.AsyncClient, queue: str, n: int) -> None:
    for start in range(0, n, 10_000):
        await client.enqueue_many_copy([{"n": i} for i in range(start, min(n, start + 10_000))],
                                       kind="noop", queue=queue)
    pool = await client.pool()
    await pool.execute("VACUUM ANALYZE awa.jobs")


async def _inserts(client: awa.AsyncClient, queue: str, n: int, bp: object) -> float:
    """µs per insert of ``n`` single inserts with backpressure ``bp``."""
    started = time.perf_counter()
    for i in range(n):
        await client.insert({"n": i}, kind="noop", queue=queue,
                            backpressure=bp)  # type: ignore[arg-type]
    return (time.perf_counter() - started) / n * 1e6


async def insert_costs(url: str, n: int, rounds: int) -> list[tuple[str, int, float]]:
    out = []
    async with awa.AsyncClient(url) as client:
        for backlog in (0, 10_000, 100_000):
            queue = f"q{backlog}"
            await _backlog(client, queue, backlog)
            pool = await client.pool()
            last = await pool.fetchval("SELECT coalesce(max(id), 0) FROM awa.jobs")
            for name, bp in (("off", "off"), ("signal", "signal"),
                             ("Reject(1_000_000)", awa.Reject(1_000_000))):
                samples = []
                for _ in range(rounds):
                    samples.append(await _inserts(client, queue, n, bp))
                    # Back to the same backlog: the inserted jobs would deepen it.
                    await pool.execute("DELETE FROM awa.jobs WHERE id > $1", last)
                    await pool.execute("VACUUM awa.jobs")
                out.append((name, backlog, statistics.median(samples)))
                print(f"insert {name:18} backlog {backlog:>7,}: "
                      f"{statistics.median(samples):7.1f} µs", flush=True)
    return out


async def count_costs(url: str, rounds: int) -> list[tuple[int, float]]:
    out = []
    async with awa.AsyncClient(url) as client:
        for cap in (1_000, 10_000, 100_000):
            samples = []
            for _ in range(rounds * 5):
                started = time.perf_counter()
                await client.queue_depth("q100000", cap=cap)
                samples.append((time.perf_counter() - started) * 1e3)
            out.append((cap, statistics.median(samples)))
            print(f"depth count cap {cap:>7,}: {statistics.median(samples):7.2f} ms", flush=True)
    return out


_TIMED_DELETES = """
CREATE FUNCTION pg_temp.timed_deletes(batch int, statements int) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    started timestamptz;
BEGIN
    SELECT array_agg(id ORDER BY id) INTO ids FROM awa.jobs WHERE queue = 'trig';
    started := clock_timestamp();
    FOR i IN 0 .. statements - 1 LOOP
        WITH moved AS (DELETE FROM awa.jobs j
                       WHERE id = ANY(ids[i * batch + 1 : (i + 1) * batch]) RETURNING j)
        INSERT INTO awa.jobs_done SELECT f.* FROM moved m,
            LATERAL awa.finished(m.j, 'completed', interval '1 day') f;
    END LOOP;
    RETURN extract(epoch FROM clock_timestamp() - started) * 1e6 / statements;
END $$
"""


def _toggle(on: bool) -> str:
    """Enable or disable the trigger that wakes waiters (0018: on the finished row)."""
    return (f"ALTER TABLE awa.jobs_done {'ENABLE' if on else 'DISABLE'}"
            " TRIGGER jobs_done_dependents")


async def trigger_costs(url: str, rounds: int) -> dict[tuple[int, int], float]:
    """Server time per finishing statement (``batch`` jobs moved from awa.jobs to
    awa.jobs_done, as every finish does) with the waiters trigger enabled and
    disabled, nobody waiting. Timed inside the server (a plpgsql loop, no commit per statement),
    so neither the network nor fsync blurs the difference."""
    out: dict[tuple[int, int], list[float]] = {}
    statements = 2000
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(_TIMED_DELETES)
        for _ in range(rounds):
            for batch in (1, 32):
                # (waiters parked on other jobs, trigger enabled); waiters=-1: disabled
                for waiters in (0, -1, 100, 1000):
                    await conn.execute("TRUNCATE awa.jobs, awa.jobs_done, awa.job_waiters")
                    await conn.execute(
                        "INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts) "
                        "SELECT 'noop', CASE WHEN g <= $2 THEN 'parked' ELSE 'trig' END, '{}', "
                        "'available', 2, 25 FROM generate_series(1, $1::int + $2) g",
                        batch * statements, max(waiters, 0))
                    await conn.execute(
                        "INSERT INTO awa.job_waiters (job_id, expires_at) "
                        "SELECT id, 'infinity' FROM awa.jobs WHERE queue = 'parked'")
                    await conn.execute("ANALYZE awa.job_waiters")
                    await conn.execute(_toggle(waiters >= 0))
                    per = await conn.fetchval("SELECT pg_temp.timed_deletes($1, $2)",
                                              batch, statements)
                    out.setdefault((batch, waiters), []).append(per)
        await conn.execute(_toggle(True))
    finally:
        await conn.close()
    medians = {k: statistics.median(v) for k, v in out.items()}
    for (batch, waiters), us in sorted(medians.items()):
        label = "trigger off" if waiters < 0 else f"{waiters:>4} waiters"
        print(f"finishing statement of {batch:>2} jobs, {label}: {us:7.1f} µs  "
              f"({' / '.join(f'{v:.1f}' for v in out[(batch, waiters)])})", flush=True)
    return medians


async def _drain(url: str, n: int, waiters: int) -> float:
    """One drain's jobs/s; ``waiters`` parked on other jobs (-1: trigger disabled)."""
    async with awa.AsyncClient(url) as client:
        pool = await client.pool()
        await pool.execute("TRUNCATE awa.jobs, awa.jobs_done, awa.job_waiters")
        await pool.execute(_toggle(waiters >= 0))
        waiters = max(waiters, 0)
        parked = []
        if waiters:
            later = datetime.now(UTC) + timedelta(hours=1)
            parked = await client.insert_many_copy([{"n": i} for i in range(waiters)],
                                                   kind="parked", queue="parked", run_at=later)
        await _backlog(client, "drain", n)
        waiting = [asyncio.create_task(j.wait(timeout=3600)) for j in parked]
        if waiters:
            while await pool.fetchval("SELECT count(*) FROM awa.job_waiters") < waiters:
                await asyncio.sleep(0.05)
        done = asyncio.Event()
        count = 0

        @client.task(kind="noop", queue="drain")
        async def noop(job: awa.JobContext) -> None:
            nonlocal count
            count += 1
            if count >= n:
                done.set()

        started = time.perf_counter()
        await client.start([("drain", 32)])
        await done.wait()
        await client.shutdown()
        elapsed = time.perf_counter() - started
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return n / elapsed


async def drain_costs(url: str, n: int, rounds: int) -> dict[int, list[float]]:
    rates: dict[int, list[float]] = {-1: [], 0: [], 100: []}  # -1: trigger disabled
    for _ in range(rounds):
        for waiters in rates:  # interleaved
            rate = await _drain(url, n, waiters)
            rates[waiters].append(rate)
            label = "trigger off" if waiters < 0 else f"{waiters:>3} waiters parked"
            print(f"drain, {label}: {rate:8,.0f} jobs/s", flush=True)
    return rates


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--inserts", type=int, default=2_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sections", default="inserts,counts,trigger,drain",
                   help="comma list of: inserts, counts (needs inserts), trigger, drain")
    a = p.parse_args()
    sections = set(a.sections.split(","))
    url = await _reset(a.database_url)
    if "inserts" in sections:
        await insert_costs(url, a.inserts, a.rounds)
    if "counts" in sections:
        await count_costs(url, a.rounds)
    if "trigger" in sections:
        await trigger_costs(url, a.rounds)
    if "drain" not in sections:
        return
    rates = await drain_costs(url, a.jobs, a.rounds)
    for waiters, values in rates.items():
        label = "trigger off" if waiters < 0 else f"{waiters} waiters"
        print(f"drain, {label}: median {statistics.median(values):,.0f} jobs/s "
              f"({' / '.join(f'{v:,.0f}' for v in values)})")


if __name__ == "__main__":
    asyncio.run(main())
