"""Reads with 10M jobs of history and a live append-only lane (issue 42, goal 4).

Seeds a fresh database (``bench_reads``): --history finished jobs in
awa.jobs_done (hourly partitions over 25 hours, 1 in 500 failed; the seed of
bench/soak.py), then a live queue state through the public API: --ring jobs
available in the append-only lane over four queues (1 in 1,000 of a rare kind),
some of them claimed and left running, and --scheduled jobs
in the mutable lane. Then times, median and p95 of --runs calls each:

* `get_job` of a finished job (the oldest), an available, a running and a
  scheduled one; `list_jobs` with each state, queue and kind filter;
  `queue_stats`; `storage_status`;
* every web UI API endpoint, over real HTTP;
* CLI commands, as a user runs them (a new process each, so Python's start is
  in the figure; `awa --version` is the floor).

    .venv/bin/python bench/reads.py [--history 10000000] [--ring 200000] [--keep] [--reuse]

Uses $DATABASE_URL's server (default postgresql://postgres@127.0.0.1:5432/postgres);
writes bench/results/reads_10m.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from soak import seed_history  # noqa: E402
from tests.ui_helpers import call, serving  # noqa: E402
from ui_load import with_db  # noqa: E402

import awa  # noqa: E402
from awa.web.ui import ui_app  # noqa: E402

DB = "bench_reads"
QUEUES = ("q0", "q1", "q2", "q3")


@dataclass
class SendEmail:
    to: str


@dataclass
class RareKind:
    n: int


async def seed(server: str, history: int, ring: int, scheduled: int, running: int) -> dict:
    """A fresh database with the history and the live state; what was seeded."""
    admin = await asyncpg.connect(server)
    await admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{DB}"')
    await admin.close()
    url = with_db(server, DB)
    async with awa.AsyncClient(url) as client:
        await client.migrate()
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        seeded = seed_history(conn, history)
    print(f"history: {history:,} rows in {time.monotonic() - started:.0f}s", flush=True)
    async with awa.AsyncClient(url) as client:
        per_queue = ring // len(QUEUES)
        for q in QUEUES:
            jobs: list[object] = [RareKind(g) if g % 1000 == 0 else SendEmail(f"u{g}@example.com")
                                  for g in range(per_queue)]
            for lo in range(0, per_queue, 50_000):
                await client.enqueue_many_copy(jobs[lo:lo + 50_000], queue=q)
        later = datetime.now(UTC) + timedelta(days=1)
        await client.enqueue_many_copy([SendEmail(f"s{g}@example.com") for g in range(scheduled)],
                                      queue="q0", run_at=later)
        pool = await client.pool()
        claimed = 0
        for q in QUEUES:
            rows = await pool.fetch("SELECT id FROM awa.claim($1, $2, 0, 0)", q,
                                    running // len(QUEUES))
            claimed += len(rows)
    conn2 = await asyncpg.connect(url)
    await conn2.execute("ANALYZE")
    await conn2.close()
    return {**seeded, "ring_available": ring - claimed, "running": claimed,
            "scheduled": scheduled}


async def timed(fn: Callable[[], Awaitable[object]], runs: int) -> tuple[float, float]:
    """Median and p95 wall ms of ``runs`` calls (after one untimed call)."""
    await fn()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.95))]


def cli_ms(url: str, args: list[str], runs: int) -> float:
    """Median wall ms of the `awa` CLI with ``args``, a new process each time."""
    exe = str(Path(sys.executable).with_name("awa"))
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([exe, "--database-url", url, *args], check=True,
                       stdout=subprocess.DEVNULL)
        samples.append((time.perf_counter() - t) * 1000)
    return statistics.median(samples)


async def main(a: argparse.Namespace) -> None:
    server = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    url = with_db(server, DB)
    seeded = None if a.reuse else await seed(server, a.history, a.ring, a.scheduled, a.running)
    rows: list[tuple[str, str, float, float]] = []

    def note(group: str, label: str, ms: tuple[float, float]) -> None:
        rows.append((group, label, *ms))
        print(f"{group:6s} {label:44s} {ms[0]:8.1f} ms (p95 {ms[1]:.1f})", flush=True)

    async with awa.AsyncClient(url) as client:
        pool = await client.pool()
        oldest = await pool.fetchval("SELECT min(id) FROM awa.jobs_done")
        available = await pool.fetchval(
            "SELECT w.id FROM awa.ready w WHERE NOT EXISTS (SELECT 1 FROM awa.receipts r "
            "WHERE r.id = w.id) ORDER BY w.id DESC LIMIT 1")
        running = await pool.fetchval("SELECT id FROM awa.receipts LIMIT 1")
        scheduled = await pool.fetchval("SELECT id FROM awa.jobs WHERE state = 'scheduled' "
                                        "LIMIT 1")
        for label, job_id in (("finished (the oldest of the history)", oldest),
                              ("available (append-only lane)", available),
                              ("running (append-only lane)", running),
                              ("scheduled (mutable lane)", scheduled)):
            note("api", f"get_job, {label}", await timed(
                lambda i=job_id: client.get_job(i), a.runs))
        for state in ("completed", "failed", "available", "running", "scheduled"):
            note("api", f"list_jobs(state={state!r}, limit=50)", await timed(
                lambda s=state: client.list_jobs(state=s, limit=50), a.runs))
        note("api", "list_jobs(queue='q1', limit=50)", await timed(
            lambda: client.list_jobs(queue="q1", limit=50), a.runs))
        note("api", "list_jobs(kind='rare_kind', limit=50)", await timed(
            lambda: client.list_jobs(kind="rare_kind", limit=50), a.runs))
        note("api", "queue_stats()", await timed(client.queue_stats, a.runs))
        note("api", "storage_status()", await timed(client.storage_status, a.runs))
        endpoints = [("dashboard (overview)", "api/overview"), ("jobs, newest", "api/jobs"),
                     ("jobs, state=available", "api/jobs?state=available"),
                     ("jobs, state=completed", "api/jobs?state=completed"),
                     ("jobs, state=failed", "api/jobs?state=failed"),
                     ("jobs, state=running", "api/jobs?state=running"),
                     ("jobs, queue=q1", "api/jobs?queue=q1"),
                     ("jobs, kind=rare_kind", "api/jobs?kind=rare_kind"),
                     ("jobs, search 'u12345@'", "api/jobs?q=u12345@"),
                     ("job detail (finished)", f"api/jobs/{oldest}"),
                     ("job detail (running)", f"api/jobs/{running}"),
                     ("queues", "api/queues"), ("dlq", "api/dlq"), ("runtime", "api/runtime")]
        async with serving(ui_app(client=client)) as base:
            for label, path in endpoints:
                async def get(p: str = path) -> None:
                    status, _ = await call(f"{base}/{p}")
                    assert status == 200, (p, status)
                note("ui", label, await timed(get, a.runs))
    for label, args in (("awa --version (the floor: Python's start)", ["--version"]),
                        ("awa queue stats", ["queue", "stats"]),
                        ("awa job list --state running", ["job", "list", "--state", "running"]),
                        ("awa job dump ID (finished)", ["job", "dump", str(oldest)]),
                        ("awa storage status", ["storage", "status"])):
        ms = cli_ms(url, args, max(3, a.runs // 4))
        note("cli", label, (ms, ms))
    lines = [f"# Reads with {a.history:,} jobs of history (issue 42, goal 4)", "",
             "`.venv/bin/python bench/reads.py` on the shared 2-core machine, PostgreSQL "
             f"{await server_version(url)}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.", ""]
    if seeded:
        lines += [f"Seeded: {seeded['rows']:,} finished jobs (bench/soak.py's history), "
                  f"{seeded['ring_available']:,} available and {seeded['running']:,} running "
                  f"in the append-only lane (four queues), {seeded['scheduled']:,} scheduled "
                  "in the mutable lane.", ""]
    lines += [f"API and UI: median and p95 of {a.runs} calls (one untimed first). CLI: median "
              "wall time of a new process per call.", "",
              "| surface | read | median ms | p95 ms |", "|---|---|---:|---:|"]
    lines += [f"| {g} | {label} | {m:.1f} | {p:.1f} |" for g, label, m, p in rows]
    out = ROOT / "bench" / "results" / "reads_10m.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    if not a.keep:
        admin = await asyncpg.connect(server)
        await admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        await admin.close()


async def server_version(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        return str(await conn.fetchval("SHOW server_version")).split()[0]
    finally:
        await conn.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--history", type=int, default=10_000_000)
    p.add_argument("--ring", type=int, default=200_000, help="ring jobs inserted")
    p.add_argument("--running", type=int, default=2_000, help="of them, claimed")
    p.add_argument("--scheduled", type=int, default=20_000)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    p.add_argument("--reuse", action="store_true", help="time the kept database again")
    asyncio.run(main(p.parse_args()))
