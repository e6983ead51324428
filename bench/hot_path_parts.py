"""Server cost per job of the claim and completion statements, schema variants A/B.

    .venv/bin/python bench/hot_path_parts.py [--rounds 7] [--jobs 20000] [--batch 32]
        [--variants base,waiters_0012,...] [--callgrind DIR]

Issue 33's features each left something on the path of a plain job: the
waiters trigger on awa.jobs DELETE (0012; since 0018 on the finished row), a
row trigger on awa.jobs_done INSERT (dependencies), an expression column in
jobs_claim_idx and two partial indexes (per-key concurrency). This measures
what each costs the server, by adding it back or taking it away (`VARIANTS`)
in a scratch database migrated by this tree.

Each round runs every variant in turn (the order rotates): apply its DDL;
empty the tables (ids from 1); insert a backlog of scheduled jobs in another
queue (``--ballast``: with only N small rows the claim would join by a seq
scan) and N available jobs; claim them with the real ``attempt_claim``
(``--batch`` per claim, as a worker with that many free slots; planned as the
worker's claim pool plans it, once per connection); complete them with the
real ``attempt_complete_batch`` in batches of ``--batch``; undo the DDL. Each
phase runs on a connection of its own, and its first `WARM_UP` statements
(planning, caches, loading plpgsql) are left out.

Cost: the backend's CPU time (/proc/PID/schedstat), µs per job, medians over
the rounds; noisy on a shared machine. Or, with ``--callgrind DIR``, against
a server run under valgrind (``--tool=callgrind --trace-children=yes
--collect-atstart=no --toggle-collect=PortalRun`` (and PortalStart,
PortalDrop, GetCachedPlan, CommitTransactionCommand) ``--dump-before=pg_sleep
--callgrind-out-file=DIR/cg.%p``), the instructions the backend ran, in
thousands per job: exact and repeatable, one round is enough.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import asyncpg
from trials import scratch_database  # bench/ (the script's own directory)

from awa.db.pool import REUSED_PLAN_SHAPE
from awa.db.queries import queries


@dataclass
class Variant:
    """DDL that takes one feature's cost away (``setup``) and puts it back (``undo``)."""

    setup: list[str] = field(default_factory=list)
    undo: list[str] = field(default_factory=list)
    claim_sql: str | None = None  # None: the tree's attempt_claim


def _old_claim(sql: str) -> str:
    return sql.replace(" AND concurrency_key IS NULL", "")


RETENTION = timedelta(days=1)
WARM_UP = 5  # statements per phase left out of its cost
OLD_WAITERS_FUNCTION = """
CREATE FUNCTION awa.notify_waiters_0012() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    done bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM awa.job_waiters) THEN
        RETURN NULL;
    END IF;
    FOR done IN
        DELETE FROM awa.job_waiters w USING finished f WHERE w.job_id = f.id
        RETURNING w.job_id
    LOOP
        PERFORM pg_notify('awa_result', done::text);
    END LOOP;
    RETURN NULL;
END $$"""

DEPENDENTS_TRIGGER = ("CREATE TRIGGER jobs_done_dependents AFTER INSERT ON awa.jobs_done"
                      " FOR EACH ROW WHEN (NEW.metadata ?| '{_awa_dependents,_awa_waited}'::text[])"
                      " EXECUTE FUNCTION awa.dependents_on_finish()")

VARIANTS: dict[str, Variant] = {
    "base": Variant(),
    # Migration 0012's waiters trigger back (0018 replaced it): statement-level,
    # with a transition table, on every DELETE from awa.jobs.
    "waiters_0012": Variant(
        setup=[OLD_WAITERS_FUNCTION,
               "CREATE TRIGGER jobs_notify_waiters_0012 AFTER DELETE ON awa.jobs"
               " REFERENCING OLD TABLE AS finished"
               " FOR EACH STATEMENT EXECUTE FUNCTION awa.notify_waiters_0012()"],
        undo=["DROP TRIGGER jobs_notify_waiters_0012 ON awa.jobs",
              "DROP FUNCTION awa.notify_waiters_0012()"]),
    # A row trigger on that DELETE, filtered by a mark in a new last column.
    "waiters_row_mark": Variant(
        setup=["ALTER TABLE awa.jobs ADD COLUMN waited boolean",
               OLD_WAITERS_FUNCTION.replace("notify_waiters_0012", "notify_waiter_row"),
               "CREATE TRIGGER jobs_notify_waiter_row AFTER DELETE ON awa.jobs FOR EACH ROW"
               " WHEN (OLD.waited) EXECUTE FUNCTION awa.notify_waiter_row()"],
        undo=["DROP TRIGGER jobs_notify_waiter_row ON awa.jobs",
              "DROP FUNCTION awa.notify_waiter_row()",
              "ALTER TABLE awa.jobs DROP COLUMN waited"]),
    # No dependents trigger on the finished rows (since 0018 it wakes waiters too).
    "no_dependents_trigger": Variant(
        setup=["DROP TRIGGER jobs_done_dependents ON awa.jobs_done"],
        undo=[DEPENDENTS_TRIGGER]),
    "no_key_indexes": Variant(
        setup=["DROP INDEX awa.jobs_concurrency_claim_idx",
               "DROP INDEX awa.jobs_concurrency_slot_idx"],
        undo=["CREATE INDEX jobs_concurrency_claim_idx ON awa.jobs"
              " (queue, concurrency_key, priority, run_at, id)"
              " WHERE state = 'available' AND concurrency_key IS NOT NULL",
              "CREATE UNIQUE INDEX jobs_concurrency_slot_idx ON awa.jobs"
              " (concurrency_key, concurrency_slot) WHERE concurrency_slot IS NOT NULL"
              " AND state IN ('running', 'waiting_external')"]),
    "old_claim_idx": Variant(
        setup=["DROP INDEX awa.jobs_claim_idx",
               "CREATE INDEX jobs_claim_idx ON awa.jobs (queue, priority, run_at, id)"
               " WHERE state = 'available'"],
        undo=["DROP INDEX awa.jobs_claim_idx",
              "CREATE INDEX jobs_claim_idx ON awa.jobs"
              " (queue, (concurrency_key IS NULL), priority, run_at, id)"
              " WHERE state = 'available'"],
        claim_sql="old"),
}


def cpu_ns(pid: int) -> int:
    """Nanoseconds process ``pid`` has run on a CPU (/proc/PID/schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


async def one(url: str, variant: Variant, jobs: int, batch: int, ballast: int,
              callgrind: Path | None) -> tuple[float, float]:
    """Claim then complete ``jobs`` jobs; (claim, completion) server cost per job:
    µs of CPU, or instructions (thousands) when the server runs under ``callgrind``
    (each phase on a connection of its own, whose backend's profile is its cost)."""
    q = queries()
    claim = q["attempt_claim"] if variant.claim_sql is None else _old_claim(q["attempt_claim"])
    admin = await asyncpg.connect(url)
    for ddl in variant.setup:
        await admin.execute(ddl)
    try:
        # The same physical start for every variant: empty tables, ids from 1,
        # a backlog elsewhere (as in a real deployment: with only N small rows
        # the claim would join by a seq scan), then the N jobs.
        await admin.execute("TRUNCATE awa.jobs, awa.jobs_done, awa.job_waiters RESTART IDENTITY")
        await admin.execute(
            "INSERT INTO awa.jobs (kind, queue, args, state, run_at, priority, max_attempts)"
            " SELECT 'later', 'ballast', '{}', 'scheduled', now() + interval '1 day', 2, 25"
            " FROM generate_series(1, $1) g", ballast)
        await admin.execute(
            "INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts)"
            " SELECT 'bench_job', 'bench', jsonb_build_object('seq', g), 'available', 2, 25"
            " FROM generate_series(1, $1) g", jobs)
        await admin.execute("VACUUM ANALYZE awa.jobs")
        costs = []
        claimed: list[tuple[int, int]] = []
        warm = WARM_UP * batch  # jobs each phase runs before its cost is counted
        for phase in ("claim", "complete"):
            # As the worker's claim pool, which also writes the completion batches.
            conn = await asyncpg.connect(url, server_settings={
                "jit": "off", "plan_cache_mode": "force_generic_plan", **REUSED_PLAN_SHAPE})
            pid = await conn.fetchval("SELECT pg_backend_pid()")
            c0 = 0
            for n in range(0, jobs, batch):
                if n == warm:  # planned, caches filled, plpgsql loaded: count from here
                    c0 = cpu_ns(pid)
                    if callgrind is not None:
                        await conn.execute("SELECT pg_sleep(0)")  # callgrind: dump, zero
                if phase == "claim":
                    rows = await conn.fetch(claim, "bench", batch, 0.0, 0.0)
                    claimed += [(r["id"], r["run_lease"]) for r in rows]
                else:
                    part = claimed[n:n + batch]
                    done = await conn.fetch(q["attempt_complete_batch"], [p[0] for p in part],
                                            [p[1] for p in part], None, RETENTION)
                    assert len(done) == len(part)
            if phase == "claim":
                assert len(claimed) == jobs, len(claimed)
            if callgrind is None:
                costs.append((cpu_ns(pid) - c0) / (jobs - warm) / 1e3)
            else:
                await conn.execute("SELECT pg_sleep(0)")
                costs.append(await _instructions(callgrind, pid) / (jobs - warm) / 1e3)
            await conn.close()
    finally:
        for ddl in variant.undo:
            await admin.execute(ddl)
        await admin.close()
    return costs[0], costs[1]


async def _instructions(directory: Path, pid: int) -> int:
    """Instructions a backend ran in its statements between its first and second
    ``pg_sleep`` (the server runs with callgrind's ``--dump-before=pg_sleep``)."""
    for _ in range(600):
        for f in directory.glob(f"cg.{pid}.2"):
            for line in f.read_text().splitlines():
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        await asyncio.sleep(0.1)
    raise RuntimeError(f"no callgrind profile for backend {pid} in {directory}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--ballast", type=int, default=20_000,
                        help="scheduled jobs of another queue left in awa.jobs throughout")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--callgrind", type=Path, help="the server runs under callgrind,"
                        " its profiles (--callgrind-out-file=DIR/cg.%%p) land here")
    parser.add_argument("--db", default=f"hotpath_parts_{os.getpid()}")
    opts = parser.parse_args()
    names = opts.variants.split(",")
    import awa

    async with scratch_database(opts.database_url, opts.db) as url:
        await awa.migrate(url)
        res: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        cg = opts.callgrind

        if cg is None:
            await one(url, VARIANTS["base"], opts.jobs, opts.batch, opts.ballast, cg)  # warm up
        for r in range(opts.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                res[name].append(await one(url, VARIANTS[name], opts.jobs, opts.batch,
                                           opts.ballast, cg))
            print(f"round {r + 1}: " + ", ".join(
                f"{n} {res[n][-1][0]:.1f}/{res[n][-1][1]:.1f}" for n in names), flush=True)
    base = res[names[0]]
    unit = "µs" if opts.callgrind is None else "k instructions"
    print(f"\n| variant ({opts.jobs:,} jobs, batch {opts.batch}) | claim {unit}/job | "
          f"completion {unit}/job | completion ÷ first (median of rounds) | spread (min-max) |")
    print("|---|---:|---:|---:|---|")
    for name in names:
        claim = statistics.median(x[0] for x in res[name])
        comp = [x[1] for x in res[name]]
        ratio = statistics.median(a[1] / b[1] for a, b in zip(res[name], base, strict=True))
        print(f"| {name} | {claim:.2f} | {statistics.median(comp):.2f} | {ratio:.3f} | "
              f"{min(comp):.2f}-{max(comp):.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
