"""A fan-out of N children after one parent (issue 40, item 3): how long their
release takes, and that every child runs exactly once.

    .venv/bin/python bench/fanout.py [--children 1000000] [--chunk 5000]
                                     [--database-url URL] [--out bench/results/fanout.md]

On a fresh database of the server at URL (default the machine's PostgreSQL):

1. one parent, then N children ``enqueue_many_copy(..., after=[parent])``
   (timed);
2. a worker serving only the parent's queue runs the parent; the statement
   that completes it releases the first 1,000 children, and the workers'
   ``release`` service (every worker runs it) the rest, one chunk per
   transaction. Timed from the parent's finish to the last edge resolved
   (``max(resolved_at)``), with nothing else running: the release alone;
3. a second worker drains the children's queue; each handler counts its job
   in memory. Checked: every child ran once (the in-memory count, and
   ``attempt = 1`` and ``completed`` for all N in ``awa.jobs_done``), no edge
   left open, no release row left.

Appends a dated section to ``--out``. Not part of CI.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from dependencies import _fresh_db  # noqa: E402  (bench/dependencies.py)

import awa  # noqa: E402
from awa.core import states  # noqa: E402
from awa.maintenance.services import DependencyReleaser  # noqa: E402


async def _poll(conn: asyncpg.Connection, sql: str, until: object, every: float,
                label: str, *args: object) -> None:
    start = time.monotonic()
    while True:
        value = await conn.fetchval(sql, *args)
        if value == until:
            return
        print(f"  {label}: {value} ({time.monotonic() - start:.0f} s)", flush=True)
        await asyncio.sleep(every)


def _set_chunk(client: awa.AsyncClient, chunk: int) -> None:
    """The release service's chunk (children per transaction) in ``client``'s worker."""
    assert client.runtime is not None
    release = client.runtime.service("release")
    assert isinstance(release, DependencyReleaser)
    release.chunk_size = chunk


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--children", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=states.DEPENDENCY_RELEASE_CHUNK)
    ap.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--out", default=str(HERE / "results" / "fanout.md"))
    ap.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = ap.parse_args()
    n = args.children
    db_name = "awa_bench_fanout"
    url = await _fresh_db(args.database_url, db_name)

    runs: collections.Counter[int] = collections.Counter()
    root = awa.AsyncClient(url)
    drainer = awa.AsyncClient(url)
    await root.migrate()

    @root.task(kind="root", queue="root")
    async def run_root(job: awa.Job) -> None:
        return None

    @drainer.task(kind="child", queue="fan")
    async def run_child(job: awa.Job) -> None:
        runs[job.id] += 1

    conn = await asyncpg.connect(url)
    try:
        parent = await root.insert({}, kind="root", queue="root")
        t = time.monotonic()
        batch = 100_000
        for start in range(0, n, batch):
            size = min(batch, n - start)
            await root.enqueue_many_copy([{"i": i} for i in range(start, start + size)],
                                         kind="child", queue="fan", after=[parent])
        insert_s = time.monotonic() - t
        print(f"inserted {n:,} children in {insert_s:.1f} s", flush=True)
        await conn.execute("VACUUM ANALYZE awa.jobs")
        await conn.execute("VACUUM ANALYZE awa.job_dependencies")

        # 2. The parent runs; its finish and the release service release the children.
        t = time.monotonic()
        await root.start([("root", 1)])
        _set_chunk(root, args.chunk)
        await _poll(conn, "SELECT count(*) FROM awa.jobs WHERE id = $1", 0, 1.0,
                    "parent active", parent.id)
        await _poll(conn, "SELECT count(*) FROM awa.dependency_releases", 0, 5.0,
                    "parents with children left to release")
        wall_s = time.monotonic() - t
        row = await conn.fetchrow(
            "SELECT (SELECT finalized_at FROM awa.jobs_done WHERE id = $1) AS finished, "
            "max(resolved_at) AS last, count(*) FILTER (WHERE resolved_at IS NULL) AS open, "
            "count(*) AS edges FROM awa.job_dependencies WHERE parent_id = $1", parent.id)
        release_s = (row["last"] - row["finished"]).total_seconds()
        available = await conn.fetchval(
            "SELECT count(*) FROM awa.jobs WHERE kind = 'child' AND state = 'available'")
        chunks = getattr(root.runtime.service("release"), "chunks", None) \
            if root.runtime else None
        print(f"released {available:,} in {release_s:.1f} s after the parent's finish",
              flush=True)

        # 3. Drain: every child exactly once.
        t = time.monotonic()
        await drainer.start([("fan", 64)])
        _set_chunk(drainer, args.chunk)
        await _poll(conn, "SELECT count(*) FROM awa.jobs WHERE kind = 'child'", 0, 2.0,
                    "children left")
        await drainer.shutdown(timeout_ms=30_000)
        drain_s = time.monotonic() - t
        await root.shutdown(timeout_ms=10_000)
        done = await conn.fetchrow(
            "SELECT count(*) AS n, count(*) FILTER (WHERE attempt = 1) AS first, "
            "count(DISTINCT id) AS ids FROM awa.jobs_done "
            "WHERE kind = 'child' AND state = 'completed'")
        left = await conn.fetchval("SELECT count(*) FROM awa.dependency_releases")
        ok = (len(runs) == n and set(runs.values()) == {1} and done["n"] == n
              and done["first"] == n and done["ids"] == n and row["open"] == 0
              and row["edges"] == n and available == n and left == 0)
        pg = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
        await root.close()
        await drainer.close()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows = [
        ("insert, `enqueue_many_copy(..., after=[parent])` in calls of 100,000",
         f"{insert_s:.1f} s ({n / insert_s:,.0f} jobs/s)"),
        ("release: parent's finish → last edge resolved (`max(resolved_at)`)",
         f"**{release_s:.1f} s** ({n / max(release_s, 1e-9):,.0f} children/s)"),
        ("release, wall clock from the worker's start to no release row left",
         f"{wall_s:.1f} s"),
        (f"chunks of {args.chunk:,} written by this process's release service", f"{chunks}"),
        ("children available after the release", f"{available:,}"),
        ("drain of the children (one worker, 64 slots; polled every 2 s)",
         f"{drain_s:.1f} s ({n / drain_s:,.0f} jobs/s)"),
        ("children run (in-memory count), distinct",
         f"{len(runs):,}, each {sorted(set(runs.values()))} time(s)"),
        ("children completed in `awa.jobs_done`, with `attempt = 1`",
         f"{done['n']:,}, {done['first']:,}"),
        ("edges left open, release rows left", f"{row['open']}, {left}"),
        ("**every child exactly once**", f"**{'yes' if ok else 'NO'}**"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    text = (f"\n## {when}: {n:,} children after one parent\n\n"
            f"`.venv/bin/python bench/fanout.py --children {n} --chunk {args.chunk}` on the "
            f"machine's PostgreSQL {pg} (2 cores shared with other work: absolute figures "
            f"drift).\n\n| step | figure |\n|---|---|\n{table}\n")
    print(text)
    out = Path(args.out)
    if not out.exists():
        out.write_text("# Fan-out: children released after one parent (bench/fanout.py)\n")
    with out.open("a") as f:
        f.write(text)
    if not args.keep:
        admin = await asyncpg.connect(args.database_url)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {db_name} WITH (FORCE)")
        finally:
            await admin.close()
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    asyncio.run(main())
