"""Run every chaos scenario and write a results table.

    python -m tests.chaos --long            # 50,000 jobs per scenario
    python -m tests.chaos --jobs 5000 --only sigkill,clock_skew

Uses ``$DATABASE_URL``'s server (else the embedded PostgreSQL) for a fresh database per
scenario, and a private throw-away cluster for the restart scenarios. Writes
bench/results/chaos.md (``--out``); exits 1 if any scenario found a violation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from tests.chaos import scenarios
from tests.chaos.harness import Report
from tests.chaos.pgcluster import PrivateCluster

ROOT = Path(__file__).resolve().parents[2]


async def _fresh(server: str, name: str) -> str:
    conn = await asyncpg.connect(server)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return urlunsplit(urlsplit(server)._replace(path="/" + name))


def _plan(jobs: int, hold_s: float, cluster: Callable[[], PrivateCluster]) -> dict[
        str, Callable[[str], Awaitable[Report]]]:
    return {
        "sigkill": lambda url: scenarios.sigkill(url, jobs),
        "pg_restart_fast": lambda url: scenarios.pg_restart(cluster(), url, jobs, "fast"),
        "pg_restart_immediate": lambda url: scenarios.pg_restart(cluster(), url, jobs,
                                                                 "immediate"),
        "pg_restart_drain": lambda url: scenarios.pg_restart_drain(cluster(), url, jobs * 4),
        "terminate_backends": lambda url: scenarios.terminate_backends(url, jobs),
        "pool_exhausted": lambda url: scenarios.pool_exhausted(url, jobs),
        "half_open_all": lambda url: scenarios.half_open(url, jobs, "all"),
        "half_open_listen": lambda url: scenarios.half_open(url, jobs, "listen"),
        "held_xmin": lambda url: scenarios.held_xmin(url, jobs, hold_s),
        "leader_kill_cron": lambda url: scenarios.leader_kill_cron(url, jobs),
        "leader_kill_rescue": lambda url: scenarios.leader_kill_rescue(url, jobs),
        "clock_skew": lambda url: scenarios.clock_skew(url, jobs),
        "recovery_defaults": lambda url: scenarios.recovery_time_defaults(url),
        "recovery_defaults_leader": lambda url: scenarios.recovery_time_defaults(
            url, victim_is_leader=True),
    }


def table(reports: list[Report], jobs: int) -> str:
    lines = [f"# Chaos suite: {jobs:,} jobs per scenario", "",
             f"`python -m tests.chaos --jobs {jobs}` on {time.strftime('%Y-%m-%d')}; "
             "recovery = seconds from the fault until completions are back at half the "
             "pre-fault rate (SIGKILL / rescue scenarios: until the killed worker's jobs "
             "ran again).", "",
             "| scenario | jobs | all jobs | runs (re-runs) | recovery s | rate before, jobs/s "
             "| violations | notes |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in reports:
        rec = "-" if r.recovery_s is None else f"{r.recovery_s:.1f}"
        notes = ", ".join(f"{k}={v}" for k, v in r.notes.items())
        lines.append(f"| {r.scenario} | {r.jobs:,} | {r.total:,} | {r.runs:,} ({r.reruns:,}) "
                     f"| {rec} | {r.baseline_rate:,.0f} | {len(r.violations)} | {notes} |")
    bad = [r for r in reports if r.violations]
    for r in bad:
        lines += ["", f"## {r.scenario}: violations", ""] + [f"- {v}" for v in r.violations]
    return "\n".join(lines) + "\n"


async def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos")
    parser.add_argument("--long", action="store_true", help="50,000 jobs per scenario")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--hold-s", type=float, default=None, help="held-xmin duration")
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "chaos.md"))
    opts = parser.parse_args()
    jobs = opts.jobs or (50_000 if opts.long else 1_500)
    hold = opts.hold_s or (180.0 if opts.long else 10.0)
    server = os.environ.get("DATABASE_URL")
    if not server:
        from awa.db.embedded import embedded_database_url

        server = embedded_database_url()
    private: list[PrivateCluster] = []

    def cluster() -> PrivateCluster:
        if not private:
            private.append(PrivateCluster().init())
        return private[0]
    plan = _plan(jobs, hold, cluster)
    names = [n for n in opts.only.split(",") if n] or list(plan)
    reports: list[Report] = []
    try:
        for name in names:
            base = cluster().url if name.startswith("pg_restart") else server
            url = await _fresh(base, f"awa_chaos_{name}")
            report = await plan[name](url)
            print(report.line(), flush=True)
            for v in report.violations:
                print("  VIOLATION:", v, flush=True)
            reports.append(report)
            Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
            Path(opts.out).write_text(table(reports, jobs))
    finally:
        for c in private:
            c.destroy()
    print(f"wrote {opts.out}")
    return 1 if any(r.violations for r in reports) else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
