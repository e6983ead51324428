"""Claims per drain: how many claim statements one or more worker processes need.

    .venv/bin/python bench/drain_claims.py [--jobs 20000] [--workers 1,2] [--rounds 2]

Each trial is a fresh database: W worker processes (one queue, concurrency 32
each, as bench/run.py's drains) start idle, then N no-op jobs are COPYed in
(one commit, whose NOTIFY wakes them). Reported: jobs/s from that commit to
the last completion, and the claims that took jobs (the rows the drain added
to `awa.claim_log`: one per claim of the append-only lane that moved its
cursor) with the jobs per claim. It tells whether a drain is bound by the
number of claims (their fixed cost, the queue's claim lock) or by something
else (bench/README.md, "Two workers on two cores"). The server is
`$DATABASE_URL`'s (default: the local PostgreSQL 15).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

# bench/ (the script's own directory)
from trials import noop_client, scratch_database, wait_drained

WORKER = """
import asyncio, sys
sys.path.insert(0, sys.argv[2])
from trials import noop_client
async def main():
    client = await noop_client(sys.argv[1])
    await client.start(queues=[("bench", 32)])
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "stop"
    await client.shutdown()
    await client.close()
asyncio.run(main())
"""


async def trial(admin: str, jobs: int, workers: int) -> dict[str, float]:
    """One drain by ``workers`` processes in a database of its own."""
    import asyncpg

    here = os.path.dirname(os.path.abspath(__file__))
    async with scratch_database(admin, f"bench_drain_claims_{os.getpid()}") as url:
        client = await noop_client(url)  # migrates the database
        side = await asyncpg.connect(url)
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, url, here], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                 for _ in range(workers)]
        try:
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            before = await side.fetchval("SELECT count(*) FROM awa.claim_log")
            # One commit to idle workers (its NOTIFY wakes them): the clock runs from it.
            await client.enqueue_many_copy([{"seq": i} for i in range(jobs)],
                                           kind="bench_job", queue="bench")
            started = time.perf_counter()
            await wait_drained(side, jobs)
            elapsed = time.perf_counter() - started
            claims = await side.fetchval("SELECT count(*) FROM awa.claim_log") - before
        finally:
            for p in procs:
                p.communicate("stop\n", timeout=30)
            await side.close()
            await client.close()
    return {"rate": jobs / elapsed, "claims": claims, "per_claim": jobs / max(1, claims)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--workers", default="1,2", help="worker process counts, comma list")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = p.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    for r in range(args.rounds):
        for w in counts:  # alternating: a drift of the machine weighs on every count
            t = asyncio.run(trial(args.database_url, args.jobs, w))
            print(f"round {r + 1}, {w} worker(s): {t['rate']:,.0f} jobs/s, "
                  f"{t['claims']} claims, {t['per_claim']:.0f} jobs per claim", flush=True)


if __name__ == "__main__":
    main()
