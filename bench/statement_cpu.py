"""Server CPU of one-row statements on awa.jobs: this tree's schema against a baseline's.

    .venv/bin/python bench/statement_cpu.py --baseline /path/to/old/checkout [--rounds 5]

Each tree migrates its own scratch database (a process with that tree on
``PYTHONPATH``). Then, rounds alternating between the two, a plpgsql loop in
one transaction (rolled back) runs N one-row statements and reads the
backend's own CPU time (utime + stime, /proc/self/stat via pg_read_file:
superuser, server on this machine) before and after:

* ``insert``: the ``job_insert_one`` statement of `client.insert`, inlined;
* ``update``: ``UPDATE awa.jobs SET heartbeat_at = now() WHERE id = $1`` on
  N different rows (the per-statement cost every claim, heartbeat, retry,
  snooze and progress write pays).

No network, no commit: the executor's per-statement work only (constraint
and trigger set-up, index inserts). CPU time, not wall time, so a busy
neighbour moves it less. Medians in µs per statement. See bench/README.md,
"Insert path".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from pathlib import Path

import asyncpg
from trials import scratch_database  # bench/ (the script's own directory)

ROOT = Path(__file__).resolve().parent.parent

LOOPS = """
CREATE FUNCTION pg_temp.cpu() RETURNS bigint LANGUAGE sql AS $$
    SELECT f[12]::bigint + f[13]::bigint
    FROM (SELECT string_to_array(split_part(pg_read_file('/proc/self/stat'), ') ', 2), ' ')
          AS f) s $$;
CREATE FUNCTION pg_temp.per_statement(what text, n int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE c0 bigint; first_id bigint; r record;
BEGIN
    IF what = 'update' THEN
        INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts)
        SELECT 'k', 'q', '{}', 'available', 2, 25 FROM generate_series(1, n);
        SELECT min(id) INTO first_id FROM awa.jobs;
    END IF;
    c0 := pg_temp.cpu();
    FOR i IN 1..n LOOP
        IF what = 'insert' THEN
            INSERT INTO awa.jobs (kind, queue, args, state, run_at, priority, max_attempts,
                                  tags, metadata, unique_key, unique_states, ordering_key,
                                  concurrency_key, concurrency_limit)
            SELECT 'bench_job', 'bench', '{"seq": 1, "sent_at": 0.0}'::text::jsonb,
                   CASE WHEN NULL::timestamptz > now() THEN 'scheduled' ELSE 'available'
                   END::awa.job_state, coalesce(NULL::timestamptz, now()), 2, 25,
                   '{}'::text[], '{}'::text::jsonb, NULL, NULL, NULL, NULL, NULL
            RETURNING id, state, created_at INTO r;
        ELSE
            UPDATE awa.jobs SET heartbeat_at = now() WHERE id = first_id + i - 1;
        END IF;
    END LOOP;
    RETURN pg_temp.cpu() - c0;
END $$;
"""


async def per_statement(url: str, what: str, n: int) -> float:
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute(LOOPS)
            ticks = await conn.fetchval("SELECT pg_temp.per_statement($1, $2)", what, n)
            raise _Rollback(ticks / os.sysconf("SC_CLK_TCK") / n * 1e6)
    except _Rollback as done:
        return done.value
    finally:
        await conn.close()


class _Rollback(Exception):
    def __init__(self, value: float) -> None:
        self.value = value


def migrate(tree: Path, url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    subprocess.run([sys.executable, "-c", "import asyncio, sys, awa; "
                    "asyncio.run(awa.migrate(sys.argv[1]))", url], env=env, check=True)


async def main(args: argparse.Namespace) -> None:
    trees = {"this tree": ROOT, "baseline": args.baseline}
    async with scratch_database(args.database_url, "bench_stmt_cpu_a") as a, \
            scratch_database(args.database_url, "bench_stmt_cpu_b") as b:
        urls = dict(zip(trees, (a, b), strict=True))
        for name, tree in trees.items():
            migrate(tree, urls[name])
        results: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for what in ("insert", "update"):
                for name in (trees if r % 2 == 0 else reversed(list(trees))):
                    v = await per_statement(urls[name], what, args.n)
                    results.setdefault((name, what), []).append(v)
            print(f"round {r + 1}: " + ", ".join(
                f"{k[0]} {k[1]} {v[-1]:.1f}" for k, v in results.items()), flush=True)
    print("\n| statement | baseline µs | this tree µs | this ÷ baseline |\n|---|---:|---:|---:|")
    for what in ("insert", "update"):
        base = statistics.median(results[("baseline", what)])
        this = statistics.median(results[("this tree", what)])
        print(f"| one-row {what} | {base:.1f} | {this:.1f} | {this / base:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the other checkout")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    asyncio.run(main(parser.parse_args()))
