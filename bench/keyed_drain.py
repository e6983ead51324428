"""Drain throughput of keyed jobs (per-key concurrency) against unkeyed ones.

    python bench/keyed_drain.py                      # this tree: unkeyed, 1, 100, 10,000 keys
    python bench/keyed_drain.py --main /work/main    # also main's unkeyed drain, alternating
    python bench/keyed_drain.py --baseline /tmp/old  # every scenario on another tree too

Each trial is a fresh database and a fresh process (``PYTHONPATH`` picks the
source tree, so main and this branch run the same harness): N jobs are
COPYed in (one commit) to an idle worker (32 slots, no-op handler,
claim-ahead as usual), and the rate is N over the time from the insert's commit until
``awa.jobs`` is empty (polled every 5 ms on a side connection). Keyed scenarios spread the N
jobs evenly over K keys with ``max_in_flight=1000``, a limit that never binds (a worker keeps up to
its 32 slots, 32 claimed ahead and the completions not yet flushed in flight),
so the figure is the mechanism's cost (the walk over keys, the slot grant),
not the limit's effect. Rounds alternate the scenarios, and each figure is
the median round. Results: bench/results/keyed_drain.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SLOTS = 32
LIMIT = 1000  # per key: above what one worker keeps in flight (slots + claimed ahead + unflushed)


async def trial(url: str, admin: str, db: str, keys: int, jobs: int) -> float:
    import asyncpg

    import awa

    conn = await asyncpg.connect(admin)
    await conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    await conn.execute(f'CREATE DATABASE "{db}"')
    await conn.close()
    try:
        await awa.migrate(url)
        client = awa.AsyncClient(url)

        @client.task(kind="bench_job", queue="bench")
        async def handle(job: object) -> None:
            return None

        args = [{"seq": i} for i in range(jobs)]
        opts = None
        queues: list[object] = [("bench", SLOTS)]
        if keys:
            opts = [{"concurrency_key": f"tenant-{i % keys}", "max_in_flight": LIMIT}
                    for i in range(jobs)]
            queues = [{"name": "bench", "max_workers": SLOTS, "key_max_in_flight": LIMIT}]
        side = await asyncpg.connect(url)
        await client.start(queues=queues)  # idle until the jobs land, all in one commit
        await client.enqueue_many_copy(args, opts=opts, kind="bench_job", queue="bench")
        started = time.perf_counter()  # the COPY has committed (claims may have begun)
        while await side.fetchval("SELECT count(*) FROM awa.jobs") > 0:
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
        done = await side.fetchval("SELECT count(*) FROM awa.jobs_done WHERE state = 'completed'")
        assert done == jobs, (done, jobs)
        await side.close()
        await client.shutdown()
        await client.close()
        return jobs / elapsed
    finally:
        conn = await asyncpg.connect(admin)
        await conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await conn.close()


def run_trial(src: Path, admin: str, keys: int, jobs: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    out = subprocess.run([sys.executable, __file__, "--trial", str(keys), "--jobs", str(jobs),
                          "--database-url", admin], env=env, check=True, capture_output=True,
                         text=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["rate"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--main", type=Path, help="a checkout of main, for its unkeyed drain")
    parser.add_argument("--baseline", type=Path,
                        help="another checkout: run every scenario on it too, alternating")
    parser.add_argument("--keys", default="0,1,100,10000")
    parser.add_argument("--trial", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    admin = opts.database_url
    if opts.trial is not None:
        db = f"bench_keyed_{os.getpid()}"
        url = admin.rsplit("/", 1)[0] + "/" + db
        rate = asyncio.run(trial(url, admin, db, opts.trial, opts.jobs))
        print(json.dumps({"rate": rate}))
        return
    scenarios: list[tuple[str, Path, int]] = []
    if opts.main is not None:
        scenarios.append(("main, unkeyed", opts.main, 0))
    for k in (int(x) for x in opts.keys.split(",")):
        scenarios.append((f"branch, {k:,} keys" if k else "branch, unkeyed", ROOT, k))
        if opts.baseline is not None:
            scenarios.append((f"baseline, {k:,} keys" if k else "baseline, unkeyed",
                              opts.baseline, k))
    rates: dict[str, list[float]] = {name: [] for name, _, _ in scenarios}
    for r in range(opts.rounds):
        for name, src, keys in scenarios:
            rate = run_trial(src, admin, keys, opts.jobs)
            rates[name].append(rate)
            print(f"round {r + 1}: {name}: {rate:,.0f} jobs/s", flush=True)
    base = statistics.median(rates["branch, unkeyed"]) if "branch, unkeyed" in rates else None
    print(f"\n| scenario ({opts.jobs:,} jobs, {SLOTS} slots) | jobs/s (median) | rounds | "
          "vs branch unkeyed |")
    print("|---|---:|---|---:|")
    for name, values in rates.items():
        med = statistics.median(values)
        ratio = f"{med / base:.2f}" if base else "-"
        print(f"| {name} | {med:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | {ratio} |")


if __name__ == "__main__":
    main()
