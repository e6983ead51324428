"""Unkeyed drain A/B between two source trees: the hot-path cost of a change.

    python bench/drain_ab.py --baseline /path/to/old/checkout            # 9 rounds, 100,000 jobs
    python bench/drain_ab.py --baseline /tmp/old --rounds 5 --jobs 20000

Issue 33 asks that features a job does not use cost it at most 3% of drain
throughput. Each trial is a fresh database and a fresh process whose
``PYTHONPATH`` picks the tree: N no-op jobs are COPYed in (one commit) to an
idle worker (32 slots), and the rate is N over the time from that commit until
``awa.jobs`` is empty. Rounds alternate the two trees, so drift on a shared
machine falls on both. Besides jobs/s each trial reports CPU per job twice:
the machine's busy time (/proc/stat; counts every other process too) and its
own (the trial's process plus the server backends of its database), which
moves least with the neighbours' load. The summary gives medians and the
median of the per-round ratios.
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

ROOT = Path(__file__).resolve().parent.parent
SLOTS = 32


def busy_seconds() -> float:
    """Machine-wide busy CPU seconds so far (idle and iowait left out)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


async def trial(admin: str, jobs: int) -> dict[str, float]:
    """One drain in a database of its own; returns jobs/s and busy CPU µs per job."""
    import asyncpg


    db = f"bench_drain_ab_{os.getpid()}"
    async with scratch_database(admin, db) as url:
        client = await noop_client(url)
        side = await asyncpg.connect(url)
        await client.start(queues=[("bench", SLOTS)])
        await client.enqueue_many_copy([{"seq": i} for i in range(jobs)], kind="bench_job",
                                       queue="bench")
        started, busy, own0 = time.perf_counter(), busy_seconds(), await own_cpu(side)
        while await side.fetchval("SELECT count(*) FROM awa.jobs") > 0:
            await asyncio.sleep(0.005)
        elapsed, cpu = time.perf_counter() - started, busy_seconds() - busy
        own = sum(ms - own0.get(pid, 0.0) for pid, ms in (await own_cpu(side)).items())
        done = await side.fetchval("SELECT count(*) FROM awa.jobs_done WHERE state = 'completed'")
        assert done == jobs, (done, jobs)
        await side.close()
        await client.shutdown()
        await client.close()
        return {"rate": jobs / elapsed, "cpu_us": cpu / jobs * 1e6, "own_us": own / jobs * 1e3}


def run_trial(src: Path, admin: str, jobs: int) -> dict[str, float]:
    """Run one trial in a child process importing ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    out = subprocess.run([sys.executable, __file__, "--trial", "--jobs", str(jobs),
                          "--database-url", admin], env=env, check=True, capture_output=True,
                         text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--baseline", type=Path, required=False, help="the other checkout")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.trial:
        print(json.dumps(asyncio.run(trial(opts.database_url, opts.jobs))))
        return
    if opts.baseline is None:
        parser.error("--baseline is required")
    trees = {"this tree": ROOT, "baseline": opts.baseline}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(opts.rounds):
        for name, src in trees.items():
            res = run_trial(src, opts.database_url, opts.jobs)
            results[name].append(res)
            print(f"round {r + 1}: {name}: {res['rate']:,.0f} jobs/s, "
                  f"{res['cpu_us']:.1f} busy CPU us/job, {res['own_us']:.1f} own CPU us/job",
                  flush=True)
    pairs = zip(results["this tree"], results["baseline"], strict=True)
    ratios = [a["rate"] / b["rate"] for a, b in pairs]
    print(f"\n| tree ({opts.jobs:,} jobs, {SLOTS} slots) | jobs/s (median) | "
          "busy CPU us/job (median) | own CPU us/job (median) | rounds (jobs/s) |")
    print("|---|---:|---:|---:|---|")
    for name, rows in results.items():
        rates = [x["rate"] for x in rows]
        print(f"| {name} | {statistics.median(rates):,.0f} | "
              f"{statistics.median(x['cpu_us'] for x in rows):.1f} | "
              f"{statistics.median(x['own_us'] for x in rows):.1f} | "
              f"{', '.join(f'{v:,.0f}' for v in rates)} |")
    mine, base = (statistics.median(x["rate"] for x in results[k]) for k in trees)
    print(f"\nthis tree / baseline: ratio of medians {mine / base:.3f}, "
          f"median of per-round ratios {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
