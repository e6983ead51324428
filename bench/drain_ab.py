"""Unkeyed drain A/B between two source trees: the hot-path cost of a change.

    python bench/drain_ab.py --baseline /path/to/old/checkout            # 9 rounds, 100,000 jobs
    python bench/drain_ab.py --baseline ../old --rounds 5 --jobs 20000

Issue 33 asks that features a job does not use cost it at most 3% of drain
throughput. Each trial is a fresh database and a fresh process whose
``PYTHONPATH`` picks the tree: N no-op jobs are COPYed in (one commit) to an
idle worker (32 slots), and the rate is N over the time from that commit until
``awa.jobs_done`` holds N outcomes. Rounds alternate the two trees, so drift
on a shared machine falls on both. Besides jobs/s each trial reports CPU per
job twice: the machine's busy time (/proc/stat; counts every other process
too) and its own (the trial's process plus the server backends of its
database), which moves least with the neighbours' load, also split into the
worker's and the server's. The summary gives medians and the median of the
per-round ratios. Scratch databases are named
``$BENCH_DB_PREFIX_drain_ab_PID`` (default prefix ``bench``).
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

# bench/ (the script's own directory)
from trials import noop_client, own_cpu, scratch_database, wait_drained

ROOT = Path(__file__).resolve().parent.parent
SLOTS = 32
CALLGRIND: Path | None = None  #: --callgrind: where the server's profiles land


def busy_seconds() -> float:
    """Machine-wide busy CPU seconds so far (idle and iowait left out)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


async def trial(admin: str, jobs: int) -> dict[str, float]:
    """One drain in a database of its own; returns jobs/s and busy CPU µs per job."""
    import asyncpg


    db = f"{os.environ.get('BENCH_DB_PREFIX', 'bench')}_drain_ab_{os.getpid()}"
    async with scratch_database(admin, db) as url:
        client = await noop_client(url)
        side = await asyncpg.connect(url)
        await client.start(queues=[("bench", SLOTS)])
        await client.enqueue_many_copy([{"seq": i} for i in range(jobs)], kind="bench_job",
                                       queue="bench")
        started, busy, own0 = time.perf_counter(), busy_seconds(), await own_cpu(side)
        await wait_drained(side, jobs)
        elapsed, cpu = time.perf_counter() - started, busy_seconds() - busy
        spent = {pid: ms - own0.get(pid, 0.0) for pid, ms in (await own_cpu(side)).items()}
        own, worker = sum(spent.values()), spent[0]
        done = await side.fetchval("SELECT count(*) FROM awa.jobs_done WHERE state = 'completed'")
        assert done == jobs, (done, jobs)
        await side.close()
        await client.shutdown()
        await client.close()
        return {"rate": jobs / elapsed, "cpu_us": cpu / jobs * 1e6, "own_us": own / jobs * 1e3,
                "worker_us": worker / jobs * 1e3, "server_us": (own - worker) / jobs * 1e3}


async def trial_instructions(admin: str, jobs: int, profiles: Path) -> dict[str, float]:
    """One drain against a server run under callgrind (see bench/hot_path_parts.py:
    one profile per backend, ``profiles``/cg.PID): the instructions the worker's
    backends ran, per job. The jobs are COPYed in before the worker starts, by
    a client of their own, so its backends do nothing but the drain."""
    import asyncpg

    import awa

    db = f"{os.environ.get('BENCH_DB_PREFIX', 'bench')}_drain_cg_{os.getpid()}"
    async with scratch_database(admin, db) as url:
        client = await noop_client(url)
        async with awa.AsyncClient(url) as producer:
            await producer.enqueue_many_copy([{"seq": i} for i in range(jobs)],
                                             kind="bench_job", queue="bench")
        side = await asyncpg.connect(url)
        await client.start(queues=[("bench", SLOTS)])
        pids: set[int] = set()
        while True:
            pids |= set(await side.fetchval(
                "SELECT array_agg(pid) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()") or [])
            if await side.fetchval("SELECT count(*) FROM awa.jobs_done") >= jobs:
                break
            await asyncio.sleep(0.2)
        done = await side.fetchval("SELECT count(*) FROM awa.jobs_done WHERE state = 'completed'")
        assert done == jobs, (done, jobs)
        await side.close()
        await client.shutdown()
        await client.close()
        total = 0
        for pid in pids:
            for _ in range(600):
                found = [f for f in profiles.glob(f"cg.{pid}*")
                         if "totals:" in f.read_text() or "summary:" in f.read_text()]
                if found:
                    break
                await asyncio.sleep(0.1)
            for f in found:
                line = next(x for x in f.read_text().splitlines()
                            if x.startswith(("summary:", "totals:")))
                total += int(line.split()[1])
        return {"server_kinstr": total / jobs / 1e3}


def run_trial(src: Path, admin: str, jobs: int) -> dict[str, float]:
    """Run one trial in a child process importing ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    extra = ["--callgrind", str(CALLGRIND)] if CALLGRIND is not None else []
    out = subprocess.run([sys.executable, __file__, "--trial", "--jobs", str(jobs),
                          "--database-url", admin, *extra], env=env, check=True,
                         capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--baseline", type=Path, required=False, help="the other checkout")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--callgrind", type=Path, help="the server runs under callgrind, "
                        "its profiles (DIR/cg.PID) land here: server instructions per job")
    parser.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.trial:
        work = trial(opts.database_url, opts.jobs) if opts.callgrind is None else \
            trial_instructions(opts.database_url, opts.jobs, opts.callgrind)
        print(json.dumps(asyncio.run(work)))
        return
    global CALLGRIND
    CALLGRIND = opts.callgrind
    if opts.baseline is None:
        parser.error("--baseline is required")
    trees = {"this tree": ROOT, "baseline": opts.baseline}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(opts.rounds):
        for name, src in trees.items():
            res = run_trial(src, opts.database_url, opts.jobs)
            results[name].append(res)
            if CALLGRIND is not None:
                print(f"round {r + 1}: {name}: {res['server_kinstr']:.1f}k server instructions"
                      " per job", flush=True)
                continue
            print(f"round {r + 1}: {name}: {res['rate']:,.0f} jobs/s, "
                  f"{res['cpu_us']:.1f} busy CPU us/job, {res['own_us']:.1f} own CPU us/job "
                  f"({res['worker_us']:.1f} worker + {res['server_us']:.1f} server)", flush=True)
    if CALLGRIND is not None:
        per = [a["server_kinstr"] / b["server_kinstr"]
               for a, b in zip(results["this tree"], results["baseline"], strict=True)]
        print("\n" + ", ".join(
            f"{name}: {statistics.median(x['server_kinstr'] for x in rows):.1f}k"
            for name, rows in results.items()) + " server instructions per job (median); "
            f"this / baseline per round: {statistics.median(per):.3f} "
            f"({min(per):.3f}-{max(per):.3f})")
        return
    pairs = zip(results["this tree"], results["baseline"], strict=True)
    ratios = [a["rate"] / b["rate"] for a, b in pairs]
    print(f"\n| tree ({opts.jobs:,} jobs, {SLOTS} slots) | jobs/s (median) | "
          "busy CPU us/job | own CPU us/job | worker us/job | server us/job | "
          "rounds (jobs/s) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, rows in results.items():
        rates = [x["rate"] for x in rows]
        med = {k: statistics.median(x.get(k, 0.0) for x in rows)
               for k in ("cpu_us", "own_us", "worker_us", "server_us")}
        print(f"| {name} | {statistics.median(rates):,.0f} | {med['cpu_us']:.1f} | "
              f"{med['own_us']:.1f} | {med['worker_us']:.1f} | {med['server_us']:.1f} | "
              f"{', '.join(f'{v:,.0f}' for v in rates)} |")
    mine, base = (statistics.median(x["rate"] for x in results[k]) for k in trees)
    print(f"\nthis tree / baseline: ratio of medians {mine / base:.3f}, "
          f"median of per-round ratios {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    for key in ("own_us", "worker_us", "server_us"):
        per = [a[key] / b[key] for a, b in zip(results["this tree"], results["baseline"],
                                                strict=True)]
        print(f"{key} this / baseline: median of per-round ratios {statistics.median(per):.3f}")


if __name__ == "__main__":
    main()
