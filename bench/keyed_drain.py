"""Drain throughput of keyed jobs (per-key concurrency) against unkeyed ones.

    python bench/keyed_drain.py                      # this tree: unkeyed, 1, 100, 10,000 keys
    python bench/keyed_drain.py --main ../main       # also main's unkeyed drain, alternating
    python bench/keyed_drain.py --baseline ../old    # every scenario on another tree too

Each trial is a fresh database and a fresh process (``PYTHONPATH`` picks the
source tree, so main and this branch run the same harness): N jobs are
COPYed in (one commit) to an idle worker (32 slots, no-op handler,
claim-ahead as usual), and the rate is N over the time from the insert's commit until
``awa.jobs`` is empty (polled every 5 ms on a side connection). Keyed scenarios spread the N
jobs evenly over K keys with ``max_in_flight=1000``, a limit that never binds (a worker keeps up to
its 32 slots, 32 claimed ahead and the completions not yet flushed in flight),
so the figure is the mechanism's cost (the walk over keys, the slot grant),
not the limit's effect. Rounds alternate the scenarios, and each figure is
the median round. Each trial also reports the CPU time the worker process and
its database's server processes used per 1,000 jobs during the drain (/proc):
on a machine shared with other busy processes the rate swings by ±50 %
between rounds while this moves far less; with no-op handlers the drain is
CPU-bound on two cores, so the unkeyed ÷ keyed CPU ratio estimates the rate
ratio on a quiet machine. Results: bench/results/keyed_drain.md.
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

from trials import noop_client, own_cpu, scratch_database  # bench/ (the script's own directory)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SLOTS = 32
LIMIT = 1000  # per key: above what one worker keeps in flight (slots + claimed ahead + unflushed)




async def trial(url: str, admin: str, db: str, keys: int, jobs: int) -> tuple[float, float]:
    import asyncpg


    async with scratch_database(admin, db) as url:
        client = await noop_client(url)
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
        cpu0 = await own_cpu(side)
        while await side.fetchval("SELECT count(*) FROM awa.jobs") > 0:
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
        cpu = {pid: ms - cpu0.get(pid, 0.0) for pid, ms in (await own_cpu(side)).items()}
        done = await side.fetchval("SELECT count(*) FROM awa.jobs_done WHERE state = 'completed'")
        assert done == jobs, (done, jobs)
        await side.close()
        await client.shutdown()
        await client.close()
        return jobs / elapsed, sum(cpu.values()) / jobs * 1000


def run_trial(src: Path, admin: str, keys: int, jobs: int) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    out = subprocess.run([sys.executable, __file__, "--trial", str(keys), "--jobs", str(jobs),
                          "--database-url", admin], env=env, check=True, capture_output=True,
                         text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["rate"]), float(result["cpu"])


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
        rate, cpu = asyncio.run(trial(url, admin, db, opts.trial, opts.jobs))
        print(json.dumps({"rate": rate, "cpu": cpu}))
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
    cpus: dict[str, list[float]] = {name: [] for name, _, _ in scenarios}
    for r in range(opts.rounds):
        for name, src, keys in scenarios:
            rate, cpu = run_trial(src, admin, keys, opts.jobs)
            rates[name].append(rate)
            cpus[name].append(cpu)
            print(f"round {r + 1}: {name}: {rate:,.0f} jobs/s, {cpu:.0f} CPU ms per 1,000 jobs",
                  flush=True)
    base = statistics.median(rates["branch, unkeyed"]) if "branch, unkeyed" in rates else None
    base_cpu = statistics.median(cpus["branch, unkeyed"]) if base else None
    print(f"\n| scenario ({opts.jobs:,} jobs, {SLOTS} slots) | jobs/s (median) | rounds | "
          "vs branch unkeyed | CPU ms / 1,000 jobs (median) | rounds | unkeyed CPU / this |")
    print("|---|---:|---|---:|---:|---|---:|")
    for name, values in rates.items():
        med, cmed = statistics.median(values), statistics.median(cpus[name])
        ratio = f"{med / base:.2f}" if base else "-"
        cratio = f"{base_cpu / cmed:.2f}" if base_cpu else "-"
        print(f"| {name} | {med:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | {ratio} | "
              f"{cmed:,.0f} | {', '.join(f'{v:,.0f}' for v in cpus[name])} | {cratio} |")

if __name__ == "__main__":
    main()
