"""Web UI page load times with a million jobs in the tables.

Seeds a fresh database (``awa_ui_bench``) with 1,000,000 jobs: 600k finished
(completed, some failed) and 400k active (available in four queues, a few
running, scheduled and waiting for a callback), then times every UI API
endpoint over real HTTP (median of 5) and, when Debian's Chromium is
installed, full page loads in a headless browser. Results go to
``bench/results/ui_1m.md``.

    python bench/ui_load.py [--rows 1000000] [--keep]

Uses $DATABASE_URL's server (default postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ui_helpers import call, serving  # noqa: E402

import awa  # noqa: E402
from awa.web.ui import ui_app  # noqa: E402

DB = "awa_ui_bench"

SEED_ACTIVE = """
INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts, run_at, created_at,
                      tags, attempted_at, heartbeat_at)
SELECT CASE WHEN g % 1000 = 0 THEN 'rare_kind' ELSE 'send_email' END,
       'q' || (g % 4), jsonb_build_object('to', 'user' || g || '@example.com', 'n', g),
       CASE WHEN g % 10000 = 1 THEN 'running' WHEN g % 5000 = 2 THEN 'scheduled'
            ELSE 'available' END::awa.job_state,
       1 + g % 4, 25, now() - make_interval(secs => ($1 - g) / 1000.0),
       now() - make_interval(secs => ($1 - g) / 1000.0),
       CASE WHEN g % 777 = 0 THEN ARRAY['vip'] ELSE '{}' END,
       CASE WHEN g % 10000 = 1 THEN now() END, CASE WHEN g % 10000 = 1 THEN now() END
FROM generate_series(1, $1) g
"""

SEED_DONE = """
INSERT INTO awa.jobs_done (id, kind, queue, args, state, priority, attempt, max_attempts,
                           run_lease, run_at, created_at, attempted_at, finalized_at, tags,
                           metadata, errors, prune_after)
SELECT nextval(pg_get_serial_sequence('awa.jobs', 'id')), 'send_email', 'q' || (g % 4),
       jsonb_build_object('to', 'old' || g || '@example.com'),
       CASE WHEN g % 500 = 0 THEN 'failed' ELSE 'completed' END::awa.job_state,
       2, 1, 25, 1, now() - interval '1 hour', now() - interval '1 hour',
       now() - interval '59 minutes', now() - interval '58 minutes', '{}', '{}',
       CASE WHEN g % 500 = 0
            THEN jsonb_build_array(jsonb_build_object('error', 'boom', 'attempt', 1,
                                                      'at', now()))
       END,
       now() + interval '1 day'
FROM generate_series(1, $1) g
"""


def with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


async def seed(server: str, rows: int) -> str:
    admin = await asyncpg.connect(server)
    await admin.execute(f'DROP DATABASE IF EXISTS "{DB}"')
    await admin.execute(f'CREATE DATABASE "{DB}"')
    await admin.close()
    url = with_db(server, DB)
    async with awa.AsyncClient(url) as client:
        await client.migrate()
    conn = await asyncpg.connect(url)
    started = time.monotonic()
    done, active = rows * 6 // 10, rows - rows * 6 // 10
    await conn.execute(SEED_DONE, done)
    await conn.execute(SEED_ACTIVE, active)
    await conn.execute("VACUUM ANALYZE awa.jobs")
    await conn.execute("ANALYZE awa.jobs_done")
    total = await conn.fetchval("SELECT (SELECT count(*) FROM awa.jobs)"
                                " + (SELECT count(*) FROM awa.jobs_done)")
    print(f"seeded {total:,} jobs in {time.monotonic() - started:.0f}s", flush=True)
    await conn.close()
    return url


async def timed(url: str, runs: int = 5) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        status, _ = await call(url)
        samples.append((time.perf_counter() - t) * 1000)
        assert status == 200, (url, status)
    return statistics.median(samples)


async def browser_loads(base: str, pages: list[tuple[str, str]]) -> dict[str, float]:
    chromium = shutil.which("chromium")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        return {}
    if chromium is None:
        return {}
    out = {}
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = await browser.new_page()
        for route, view in pages:
            samples = []
            for _ in range(3):
                t = time.perf_counter()
                await page.goto(f"{base}/{route}")
                await page.wait_for_selector(f'main[data-view="{view}"]')
                samples.append((time.perf_counter() - t) * 1000)
                await page.goto("about:blank")
            out[route] = statistics.median(samples)
        await browser.close()
    return out


async def main(rows: int, keep: bool) -> None:
    server = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    url = await seed(server, rows)
    async with awa.AsyncClient(url) as client:
        some = (await client.list_jobs(state="failed", limit=1))[0].id
        endpoints = [
            ("dashboard (overview)", "api/overview"),
            ("jobs, newest", "api/jobs"),
            ("jobs, state=available", "api/jobs?state=available"),
            ("jobs, state=completed", "api/jobs?state=completed"),
            ("jobs, state=failed", "api/jobs?state=failed"),
            ("jobs, state=running", "api/jobs?state=running"),
            ("jobs, queue=q1", "api/jobs?queue=q1"),
            ("jobs, kind=rare_kind (1 in 1000)", "api/jobs?kind=rare_kind"),
            ("jobs, tag=vip", "api/jobs?tag=vip"),
            ("jobs, search 'user12345@'", "api/jobs?q=user12345@"),
            ("jobs, page 2 (cursor)", "api/jobs?cursor=500000"),
            ("job detail", f"api/jobs/{some}"),
            ("queues", "api/queues"),
            ("dlq", "api/dlq"),
            ("runtime", "api/runtime"),
            ("cron", "api/cron")]
        lines = [f"# Web UI with {rows:,} jobs", "",
                 f"Seeded {rows:,} jobs (60% finished, 40% active; see bench/ui_load.py). "
                 "Median of 5 requests over HTTP, server and database on this 2-core machine.",
                 "", "| endpoint | median ms |", "|---|---:|"]
        async with serving(ui_app(client=client)) as base:
            for label, path in endpoints:
                ms = await timed(f"{base}/{path}")
                lines.append(f"| {label} | {ms:.1f} |")
                print(f"{label:40s} {ms:8.1f} ms", flush=True)
            loads = await browser_loads(base, [
                ("#/", "dashboard"), ("#/jobs", "jobs"), ("#/jobs?state=failed", "jobs"),
                (f"#/jobs/{some}", "job"), ("#/queues", "queues"), ("#/runtime", "runtime")])
        if loads:
            lines += ["", "Full page loads in headless Chromium (navigation to rendered data, "
                      "median of 3):", "", "| page | median ms |", "|---|---:|"]
            lines += [f"| `{route}` | {ms:.0f} |" for route, ms in loads.items()]
            for route, ms in loads.items():
                print(f"page {route:34s} {ms:8.0f} ms", flush=True)
    out = ROOT / "bench" / "results" / "ui_1m.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    if not keep:
        admin = await asyncpg.connect(server)
        await admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    a = parser.parse_args()
    asyncio.run(main(a.rows, a.keep))
