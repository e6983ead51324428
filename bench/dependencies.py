"""What job dependencies cost, and what they cost jobs that do not use them.

    python bench/dependencies.py [--main-python ../main/.venv/bin/python]
                                 [--jobs N] [--rounds R] [--database-url URL]

Runs the same measurements with two interpreters, each importing its own
``awa`` (the baseline checkout's and this one's), interleaved round by
round on the same server, each on its own fresh database, and writes
``bench/results/dependencies.md``:

- **drain**: N plain jobs (no dependencies), one worker, concurrency 32,
  no-op handler: jobs/s, the figure that must not regress;
- **complete statement**: the completion batch statement alone
  (``attempt_complete_batch``, 512 jobs), median server round trip per job:
  where the finished-table trigger's ``WHEN`` test would show;
- the dependents trigger alone (this checkout): the completion statement and
  a 10,000-job drain with the trigger enabled / disabled, alternating in one
  database, which isolates the only change on the path of plain jobs;
- this checkout only: N jobs as N/2 chains of two (``chain(a, b)``), and as
  N/10 chords of 9 + 1, drained the same way (jobs/s, including the release
  of every child in its parent's completion).
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
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

HERE = Path(__file__).resolve().parent
QUEUE = "bench"


@dataclass
class Unit:
    seq: int


async def _fresh_db(admin_url: str, name: str) -> str:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return urlunsplit(urlsplit(admin_url)._replace(path="/" + name))


async def _drain(url: str, insert: Any, total: int) -> float:
    """Insert with ``insert(client)``, then time one worker draining ``total`` jobs."""
    import awa

    client = awa.AsyncClient(url)
    done = 0
    finished = asyncio.Event()

    @client.task(Unit, queue=QUEUE)
    async def handle(job: Any) -> None:
        nonlocal done
        done += 1
        if done >= total:
            finished.set()

    await insert(client)
    started = time.perf_counter()
    await client.start(queues=[(QUEUE, 32)])
    await asyncio.wait_for(finished.wait(), 600)
    elapsed = time.perf_counter() - started
    await client.shutdown(timeout_ms=5000)
    await client.close()
    return total / elapsed


async def _complete_statement(url: str, n: int) -> float:
    """Median µs per job of the completion batch statement, batches of 512."""
    import awa
    from awa.db.queries import queries

    client = awa.AsyncClient(url)
    await client.enqueue_many_copy([Unit(i) for i in range(n)], queue=QUEUE)
    pool = await client.pool()
    q = queries()
    per_job = []
    while True:
        rows = await pool.fetch(q["attempt_claim"], QUEUE, 512, 0.0, 60.0)
        if not rows:
            break
        ids = [r["id"] for r in rows]
        leases = [r["run_lease"] for r in rows]
        t = time.perf_counter()
        await pool.fetch(q["attempt_complete_batch"], ids, leases, None, timedelta(days=1))
        per_job.append((time.perf_counter() - t) / len(ids) * 1e6)
    await client.close()
    return statistics.median(per_job)


async def trigger_isolation(admin_url: str, rounds: int = 8) -> dict[str, list[float]]:
    """The completion statement with the dependents trigger enabled and disabled, in
    one database, alternating: the trigger's own cost, free of run-to-run drift."""
    import awa
    from awa.db.queries import queries

    url = await _fresh_db(admin_url, "bench_deps_trigger")
    await awa.migrate(url)
    client = awa.AsyncClient(url)
    pool = await client.pool()
    q = queries()
    res: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for mode in (("on", "off") if r % 2 else ("off", "on")):
            await pool.execute("ALTER TABLE awa.jobs_done ENABLE TRIGGER jobs_done_dependents"
                               if mode == "on" else
                               "ALTER TABLE awa.jobs_done DISABLE TRIGGER jobs_done_dependents")
            await client.enqueue_many_copy([Unit(i) for i in range(10_240)], queue=QUEUE)
            total, n = 0.0, 0
            while rows := await pool.fetch(q["attempt_claim"], QUEUE, 512, 0.0, 60.0):
                t = time.perf_counter()
                await pool.fetch(q["attempt_complete_batch"], [x["id"] for x in rows],
                                 [x["run_lease"] for x in rows], None, timedelta(days=1))
                total += time.perf_counter() - t
                n += len(rows)
            res[mode].append(total / n * 1e6)
    await client.close()
    # End to end: one worker draining plain jobs, trigger enabled / disabled.
    admin = await asyncpg.connect(url)
    for r in range(rounds):
        for mode in (("on", "off") if r % 2 else ("off", "on")):
            await admin.execute("ALTER TABLE awa.jobs_done ENABLE TRIGGER jobs_done_dependents"
                                if mode == "on" else
                                "ALTER TABLE awa.jobs_done DISABLE TRIGGER jobs_done_dependents")

            async def plain(c: Any) -> None:
                await c.enqueue_many_copy([Unit(i) for i in range(10_000)], queue=QUEUE)
            res.setdefault(f"drain_{mode}", []).append(await _drain(url, plain, 10_000))
    await admin.close()
    return res


async def child(admin_url: str, db: str, jobs: int, workflows: bool) -> dict[str, float]:
    import awa

    out: dict[str, float] = {}
    url = await _fresh_db(admin_url, db)
    await awa.migrate(url)

    async def plain(client: Any) -> None:
        await client.enqueue_many_copy([Unit(i) for i in range(jobs)], queue=QUEUE)
    out["drain"] = await _drain(url, plain, jobs)
    url = await _fresh_db(admin_url, db)
    await awa.migrate(url)
    out["complete_us"] = await _complete_statement(url, jobs)
    if workflows:
        url = await _fresh_db(admin_url, db)
        await awa.migrate(url)

        async def chains(client: Any) -> None:
            for i in range(0, jobs, 2):
                await client.enqueue_workflow(awa.chain(awa.step(Unit(i), queue=QUEUE),
                                                        awa.step(Unit(i + 1), queue=QUEUE)))
        out["chains"] = await _drain(url, chains, jobs)
        url = await _fresh_db(admin_url, db)
        await awa.migrate(url)

        async def chords(client: Any) -> None:
            for i in range(0, jobs, 10):
                await client.enqueue_workflow(awa.chord(
                    [awa.step(Unit(i + k), queue=QUEUE) for k in range(9)],
                    awa.step(Unit(i + 9), queue=QUEUE)))
        out["chords"] = await _drain(url, chords, jobs)
    return out


def _run_child(python: str, args: argparse.Namespace, db: str,
               workflows: bool) -> dict[str, Any]:
    cmd = [python, str(HERE / "dependencies.py"), "--child", db, "--jobs", str(args.jobs),
           "--database-url", args.database_url]
    if workflows:
        cmd.append("--workflows")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/", timeout=1800)
    if result.returncode != 0:
        raise SystemExit(result.stderr)
    parsed: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main-python", default=sys.executable,
                        help="an interpreter whose awa is the baseline, e.g. a main "
                             "checkout's venv (default: this one, an A/A run)")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workflows", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "trigger":
        print(json.dumps(asyncio.run(trigger_isolation(args.database_url))))
        return
    if args.child:
        print(json.dumps(asyncio.run(child(args.database_url, args.child, args.jobs,
                                           args.workflows))))
        return
    runs: dict[str, list[dict[str, Any]]] = {"main": [], "branch": []}
    for r in range(args.rounds):
        for label, python in (("main", args.main_python), ("branch", sys.executable)):
            if r % 2:  # alternate which goes first
                label, python = ("branch", sys.executable) if label == "main" else \
                    ("main", args.main_python)
            runs[label].append(_run_child(python, args, f"bench_deps_{label}",
                                          workflows=label == "branch"))
            print(label, runs[label][-1], file=sys.stderr)
    trigger = _run_child(sys.executable, args, "trigger", workflows=False)
    _report(args, runs, trigger)


def _report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]],
            trigger: dict[str, Any]) -> None:
    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[label])

    def all_of(label: str, key: str, fmt: str) -> str:
        return ", ".join(format(r[key], fmt) for r in runs[label])

    drain_m, drain_b = med("main", "drain"), med("branch", "drain")
    comp_m, comp_b = med("main", "complete_us"), med("branch", "complete_us")
    lines = [
        "# Job dependencies: cost on the hot path, and of workflows",
        "",
        f"`python bench/dependencies.py --jobs {args.jobs} --rounds {args.rounds}`; "
        "baseline = the main checkout, branch = this one, interleaved on one PostgreSQL 15 "
        "(2 shared cores: absolute figures drift; compare within the run). Medians of the "
        "rounds; every round listed.",
        "",
        "| measure (jobs without dependencies) | main | branch | branch / main |",
        "|---|---|---|---|",
        f"| drain, 1 worker, jobs/s | {drain_m:,.0f} | {drain_b:,.0f} | "
        f"{drain_b / drain_m:.3f} |",
        f"| completion batch statement, µs/job | {comp_m:.2f} | {comp_b:.2f} | "
        f"{comp_b / comp_m:.3f} |",
        "",
        f"Rounds, drain jobs/s: main {all_of('main', 'drain', ',.0f')}; "
        f"branch {all_of('branch', 'drain', ',.0f')}.",
        f"Rounds, µs/job: main {all_of('main', 'complete_us', '.2f')}; "
        f"branch {all_of('branch', 'complete_us', '.2f')}.",
        "",
        "The dependents trigger alone (branch schema, one database, the completion batch "
        "statement with the trigger enabled / disabled, 8 alternating rounds of 10,240 "
        f"jobs): median {statistics.median(trigger['on']):.2f} vs "
        f"{statistics.median(trigger['off']):.2f} µs/job "
        f"({statistics.median(trigger['on']) / statistics.median(trigger['off']):.3f}). "
        "The same, end to end (one worker draining 10,000 plain jobs, 8 alternating "
        f"rounds): median {statistics.median(trigger['drain_on']):,.0f} jobs/s with the "
        f"trigger vs {statistics.median(trigger['drain_off']):,.0f} without "
        f"({statistics.median(trigger['drain_on']) / statistics.median(trigger['drain_off']):.3f}"
        f"; rounds with: {', '.join(f'{x:,.0f}' for x in trigger['drain_on'])}; without: "
        f"{', '.join(f'{x:,.0f}' for x in trigger['drain_off'])}).",
        "",
        "| workflow drain (branch) | jobs/s | vs plain drain |",
        "|---|---|---|",
        f"| chains of 2 (half the jobs released by a parent) | {med('branch', 'chains'):,.0f} "
        f"| {med('branch', 'chains') / drain_b:.2f} |",
        f"| chords of 9 + 1 | {med('branch', 'chords'):,.0f} | "
        f"{med('branch', 'chords') / drain_b:.2f} |",
        "",
        "Inserting the workflows is not timed (one transaction per workflow, one statement "
        "per job).",
    ]
    out = HERE / "results" / "dependencies.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
