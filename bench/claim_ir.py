"""Instructions per claim, counted by callgrind: a cost figure the machine's load cannot move.

On a shared machine a claim's time moves ±25-50 % with other processes' load;
the instructions its server process executes move ±2 %. Start a throwaway
cluster under callgrind, collecting only inside the statement-execution entry
points (the names are exported, so a stripped binary will do)::

    CG="$(mktemp -d)"   # a scratch directory the postgres user can write
    initdb -D "$CG/data" -A trust -U postgres   # as the postgres user
    # port = 5491, autovacuum = off in $CG/data/postgresql.conf
    valgrind --tool=callgrind --trace-children=yes --collect-atstart=no \\
        --toggle-collect=PortalStart --toggle-collect=PortalRun \\
        --toggle-collect=PortalDrop --toggle-collect=GetCachedPlan \\
        --toggle-collect=CommitTransactionCommand \\
        --callgrind-out-file="$CG/out.%p" postgres -D "$CG/data"

then::

    python bench/claim_ir.py --database-url postgresql://postgres@127.0.0.1:5491/postgres \\
        --out "$CG" --keys 0,1,100,10000 [--src <other tree>] [--statement NAME]

Each scenario is a fresh database with N jobs COPYed in (K keys,
``max_in_flight=1000``), VACUUM ANALYZE, then one connection with the claim
pool's settings claims 32 at a time (``attempt_claim`` for K = 0, else the
keyed statement, ``attempt_claim_keyed_only`` by default, with the cursor each
claim returns) until the queue is empty, while a second connection deletes
each batch two claims later (about 64 jobs in flight). Only the claiming
backend's count is read: its instructions per claim, planning included (once
per statement, amortized). About 1-2 minutes per scenario under callgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from trials import scratch_database  # bench/ (the script's own directory)

ROOT = Path(__file__).resolve().parent.parent
WANT = 32


async def scenario(admin: str, keys: int, jobs: int, statement: str) -> dict[str, int]:
    """Drain one fresh database; the claiming backend's pid and the claims made."""
    import asyncpg

    import awa
    from awa.db.pool import REUSED_PLAN_SHAPE
    from awa.db.queries import Queries

    async with scratch_database(admin, f"bench_claim_ir_{os.getpid()}") as url:
        await awa.migrate(url)
        client = awa.AsyncClient(url)
        opts = [{"concurrency_key": f"tenant-{i % keys}", "max_in_flight": 1000}
                for i in range(jobs)] if keys else None
        await client.enqueue_many_copy([{"seq": i} for i in range(jobs)], opts=opts,
                                       kind="bench_job", queue="bench")
        await client.close()
        settings = {"jit": "off", "plan_cache_mode": "force_generic_plan", **REUSED_PLAN_SHAPE}
        c = await asyncpg.connect(url, server_settings=settings)
        d = await asyncpg.connect(url)
        await d.execute("VACUUM ANALYZE awa.jobs")
        sql = Queries()[statement if keys else "attempt_claim"]
        pid, cursor, claims, inflight = await c.fetchval("SELECT pg_backend_pid()"), "", 0, []
        while True:
            rows = await c.fetch(sql, "bench", WANT, 0.0, 0.0, *((cursor,) if keys else ()))
            claims += 1
            ids = [r["id"] for r in rows if r["id"] is not None]
            if keys and rows:
                cursor = rows[-1]["cursor"]
            inflight.append(ids)
            if not ids and not any(inflight):
                break
            if len(inflight) > 2 or not ids:
                await d.execute("DELETE FROM awa.jobs WHERE id = any($1::bigint[])",
                                inflight.pop(0))
        await c.close()
        await d.close()
        return {"pid": pid, "claims": claims}


def instructions(out: Path, pid: int) -> int:
    """The instructions callgrind counted for process ``pid`` (its dump, once it exits)."""
    for _ in range(50):
        for f in out.glob(f"*.{pid}*"):
            for line in f.read_text(errors="replace").splitlines():
                if line.startswith("summary:"):
                    return int(line.split()[1])
        time.sleep(0.2)
    raise SystemExit(f"no callgrind output for process {pid} in {out}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--out", type=Path, required=True, help="callgrind's output directory")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--keys", default="0,1,100,10000")
    parser.add_argument("--src", type=Path, default=ROOT)
    parser.add_argument("--statement", default="attempt_claim_keyed_only")
    parser.add_argument("--scenario", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.scenario is not None:
        print(json.dumps(asyncio.run(scenario(opts.database_url, opts.scenario, opts.jobs,
                                              opts.statement))))
        return
    print(f"| keys ({opts.jobs:,} jobs, claims of {WANT}) | statement | claims | "
          "instructions per claim |")
    print("|---:|---|---:|---:|")
    for k in (int(x) for x in opts.keys.split(",")):
        env = {**os.environ, "PYTHONPATH": str(opts.src / "src")}
        out = subprocess.run([sys.executable, __file__, "--scenario", str(k), "--jobs",
                              str(opts.jobs), "--database-url", opts.database_url,
                              "--out", str(opts.out), "--statement", opts.statement],
                             env=env, check=True, capture_output=True, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        ir = instructions(opts.out, r["pid"])
        name = opts.statement if k else "attempt_claim"
        print(f"| {k:,} | {name} | {r['claims']} | {ir / r['claims'] / 1e6:.2f} M |",
              flush=True)


if __name__ == "__main__":
    main()
