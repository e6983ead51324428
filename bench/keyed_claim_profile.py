"""Server-side cost of one claim, keyed against unkeyed: steadier than a drain.

    python bench/keyed_claim_profile.py                    # this tree: 0, 1, 100, 10,000 keys
    python bench/keyed_claim_profile.py --src ../old       # another tree's SQL, same harness
    python bench/keyed_claim_profile.py --explain          # also EXPLAIN (ANALYZE, BUFFERS)

A drain on a shared machine swings by ±40 % between runs; the time a claim
statement takes on the server swings much less. Each scenario is a fresh
database with N jobs COPYed in (K keys, ``max_in_flight=1000``: never
binding), then one connection drains it the way a worker does, without
handlers: claim 32 (``attempt_claim`` for K = 0, else
``attempt_claim_keyed`` with the cursor the last claim returned), commit,
and delete the batch claimed two claims earlier (so about 64 jobs stay in
flight and dead index entries pile up as in a drain). The connection has
the claim pool's settings (``create_pool(plans="reused")``: generic plans,
no JIT). Reported per claim: the median and 90th percentile of the
statement's round trip on a local socket, the whole drain's rate without
handlers, and, where the server has pg_stat_statements loaded
(``shared_preload_libraries``; a private cluster will do), the claim's mean
execution time on the server, the steadiest figure of all.

``--explain`` also runs the claim in the middle of the drain under
``EXPLAIN (ANALYZE, BUFFERS)``, in a rolled-back transaction. ``--rollback N``
runs N claim-and-rollback loops instead (the same jobs claimed again and
again).
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
from typing import Any

from trials import scratch_database  # bench/ (the script's own directory)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LIMIT = 1000
WANT = 32


async def scenario(url: str, admin: str, db: str, keys: int, jobs: int, explain: bool,
                   rollback: int) -> dict[str, object]:
    import asyncpg

    import awa
    from awa.db.pool import REUSED_PLAN_SHAPE
    from awa.db.queries import Queries
    from awa.worker.keyed import KeyedClaims

    async with scratch_database(admin, db) as url:
        await awa.migrate(url)
        client = awa.AsyncClient(url)
        args = [{"seq": i} for i in range(jobs)]
        opts = None
        if keys:
            opts = [{"concurrency_key": f"tenant-{i % keys}", "max_in_flight": LIMIT}
                    for i in range(jobs)]
        await client.enqueue_many_copy(args, opts=opts, kind="bench_job", queue="bench")
        await client.close()
        q = Queries()
        # The claim pool's settings (create_pool(plans="reused")): generic plans,
        # index-only plan shape, no JIT.
        settings = {"jit": "off", "plan_cache_mode": "force_generic_plan", **REUSED_PLAN_SHAPE}
        c = await asyncpg.connect(url, server_settings=settings)
        await c.execute("VACUUM ANALYZE awa.jobs")
        keyed = keys > 0
        sql = q["attempt_claim_keyed"] if keyed else q["attempt_claim"]
        # The statement a keyed claim runs first (trees before the split: the only one).
        first = q["attempt_claim_keyed_chunk"] if keyed and "attempt_claim_keyed_chunk" in \
            q.names() else sql
        times: list[float] = []
        plan = ""
        if rollback:
            for _ in range(rollback):
                tr = c.transaction()
                await tr.start()
                t0 = time.perf_counter()
                await c.fetch(sql, "bench", WANT, 0.0, 0.0, "", 500)
                times.append(time.perf_counter() - t0)
                await tr.rollback()
            return {"claims": len(times), "median_ms": statistics.median(times) * 1e3,
                    "p90_ms": sorted(times)[int(len(times) * 0.9)] * 1e3,
                    "max_ms": max(times) * 1e3}
        server = await server_stats_reset(c)
        backend = await c.fetchval("SELECT pg_backend_pid()")
        cpu0 = backend_cpu(backend)
        inflight: list[list[int]] = []
        started = time.perf_counter()
        claims = KeyedClaims(q, configured=True)  # the worker's keyed claim, as it runs
        while True:
            if explain and len(times) == jobs // WANT // 2:
                params: tuple[object, ...] = ("bench", WANT, 0.0, 0.0)
                if keyed:
                    params += (claims.cursor,) if first != sql else (claims.cursor, 500)
                plan = await explain_claim(c, first, params)
            t0 = time.perf_counter()
            if keyed:
                rows = await claims.claim(c, "bench", WANT, 0.0, 0.0)
            else:
                rows = await c.fetch(sql, "bench", WANT, 0.0, 0.0)
            times.append(time.perf_counter() - t0)
            ids = [r["id"] for r in rows if r["id"] is not None]
            inflight.append(ids)
            if len(inflight) > 2:
                await c.execute("DELETE FROM awa.jobs WHERE id = any($1::bigint[])",
                                inflight.pop(0))
            if not ids and not (keyed and claims.capped):
                if not inflight or not any(inflight):
                    break
                await c.execute("DELETE FROM awa.jobs WHERE id = any($1::bigint[])",
                                inflight.pop(0))
        elapsed = time.perf_counter() - started
        cpu1 = backend_cpu(backend)
        left = await c.fetchval("SELECT count(*) FROM awa.jobs")
        assert left == 0, left
        server_ms = await server_mean_ms(c, len(times)) if server else None
        await c.close()
        return {"claims": len(times), "median_ms": statistics.median(times) * 1e3,
                "p10_ms": sorted(times)[int(len(times) * 0.1)] * 1e3,
                "p90_ms": sorted(times)[int(len(times) * 0.9)] * 1e3,
                "max_ms": max(times) * 1e3, "rate": jobs / elapsed, "plan": plan,
                "server_ms": server_ms,
                "cpu_ms": None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / len(times)}


def backend_cpu(pid: int) -> float | None:
    """CPU milliseconds the server process ``pid`` has used (user + system), from
    /proc on a server on this machine; None elsewhere. Unlike wall time, it
    hardly moves with the load other processes put on the machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def server_stats_reset(c: Any) -> bool:
    """Start pg_stat_statements afresh, if the server has it loaded."""
    try:
        await c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await c.execute("SELECT pg_stat_statements_reset()")
        await c.fetchval("SELECT count(*) FROM pg_stat_statements")
    except Exception:  # not in shared_preload_libraries: client timings only
        return False
    return True


async def server_mean_ms(c: Any, claims: int) -> tuple[float, float, float] | None:
    """Per claim, on the server (pg_stat_statements): the mean execution time of
    the claim statements (a keyed claim may run two: their sum over the claims),
    the least time of one statement, and the buffers touched. pg_stat_statements
    stores the text with its constants replaced, so the claims are found as the
    statements that lock rows (nothing else this loop runs does)."""
    row = await c.fetchrow(
        "SELECT sum(total_exec_time), min(min_exec_time), sum(shared_blks_hit)::float8 "
        "FROM pg_stat_statements WHERE dbid = "
        "(SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND query LIKE '%FOR UPDATE%SKIP LOCKED%'")
    if row is None or row[0] is None:
        return None
    return (float(row[0]) / claims, float(row[1]), float(row[2]) / claims)


async def explain_claim(c: Any, sql: str, params: tuple[object, ...]) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim under its generic plan, rolled back."""
    types = ", ".join(["text", "integer", "float8", "float8", "text", "integer"][:len(params)])
    await c.execute(f"PREPARE awa_claim_profile({types}) AS {sql}")
    literals = ", ".join("'" + v.replace("'", "''") + "'" if isinstance(v, str) else str(v)
                         for v in params)
    tr = c.transaction()
    await tr.start()
    rows = await c.fetch(
        f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE awa_claim_profile({literals})")
    await tr.rollback()
    await c.execute("DEALLOCATE awa_claim_profile")
    return "\n".join(r[0] for r in rows)


def run(src: Path, admin: str, keys: int, jobs: int, explain: bool,
        rollback: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    cmd = [sys.executable, __file__, "--scenario", str(keys), "--jobs", str(jobs),
           "--database-url", admin, "--rollback", str(rollback)]
    if explain:
        cmd.append("--explain")
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--keys", default="0,1,100,10000")
    parser.add_argument("--src", type=Path, default=ROOT)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--rollback", type=int, default=0)
    parser.add_argument("--scenario", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.scenario is not None:
        db = f"bench_claim_{os.getpid()}"
        url = opts.database_url.rsplit("/", 1)[0] + "/" + db
        print(json.dumps(asyncio.run(scenario(url, opts.database_url, db, opts.scenario,
                                              opts.jobs, opts.explain, opts.rollback))))
        return
    print(f"| keys ({opts.jobs:,} jobs, claims of {WANT}) | claims | p10 ms | median ms | "
          "p90 ms | max ms | server mean ms | server min ms | buffers | server CPU ms | "
          "jobs/s (no handlers) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    plans = []
    for k in (int(x) for x in opts.keys.split(",")):
        r = run(opts.src, opts.database_url, k, opts.jobs, opts.explain, opts.rollback)
        sv = r.get("server_ms")
        server = "- | - | -" if sv is None else f"{sv[0]:.3f} | {sv[1]:.3f} | {sv[2]:.0f}"
        cpu = "-" if r.get("cpu_ms") is None else f"{r['cpu_ms']:.3f}"
        print(f"| {k:,} | {r['claims']} | {r.get('p10_ms', 0):.2f} | {r['median_ms']:.2f} | "
              f"{r['p90_ms']:.2f} | {r['max_ms']:.1f} | {server} | {cpu} | "
              f"{r.get('rate', 0):,.0f} |", flush=True)
        if r.get("plan"):
            plans.append(f"--- {k} keys ---\n{r['plan']}")
    for p in plans:
        print(p)


if __name__ == "__main__":
    main()
