"""Where a single insert's time goes, in interleaved rounds in one process.

Awa's ``client.insert``; its ``job_insert`` statement on a bare asyncpg
connection (``RETURNING *`` and ``RETURNING id``); PgQueuer's
``Queries.enqueue``; raw-sql's insert + ``pg_notify``; a one-column INSERT.

    .venv/bin/python bench/insert_single_breakdown.py [--src DIR] [--n 400] [--rounds 7]

``--src``: a checkout whose ``src/`` awa is imported from (default: this
repo). PgQueuer comes from ``bench/.venvs/pgqueuer`` (made by ``run.py``).
Per insert: median wall µs, client CPU µs and backend CPU µs (utime + stime
of the database's backends from /proc: the server must run on this machine).
See README.md, "Insert path".
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class BenchJob:
    seq: int
    sent_at: float = 0.0


def payload(i: int) -> str:
    return json.dumps({"seq": i, "sent_at": time.time()})


async def main(args: argparse.Namespace) -> None:
    sys.path.insert(0, os.path.join(args.src, "src"))
    sys.path += glob.glob(os.path.join(HERE, ".venvs/pgqueuer/lib/python3*/site-packages"))
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries as PgqQueries

    import awa
    from awa.db.pool import init_connection
    from awa.db.queries import queries

    admin = await asyncpg.connect(args.database_url)

    def url(db: str) -> str:
        return args.database_url.rsplit("/", 1)[0] + "/" + db

    async def fresh(db: str) -> str:
        await admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {db}")
        return db

    systems: dict[str, tuple[str, Callable[[int], Awaitable[object]]]] = {}
    db = await fresh("insert_breakdown_awa")
    client = awa.AsyncClient(url(db), max_connections=2)
    await client.migrate()
    systems["awa insert"] = (db, lambda i: client.insert(BenchJob(i, time.time()),
                                                         queue="bench"))
    bare = await asyncpg.connect(url(db))
    await init_connection(bare)
    sql = queries()["job_insert"]
    for label, returning in (("stmt RETURNING *", "*"), ("stmt RETURNING id", "id")):
        stmt = await bare.prepare(sql.replace("RETURNING *", f"RETURNING {returning}"))
        systems[label] = (db, lambda i, s=stmt: s.fetchrow(
            "bench_job", "bench", payload(i), None, 2, 25, [], "{}", None, None, None,
            None, None))
    db = await fresh("insert_breakdown_pgq")
    pgq = PgqQueries(AsyncpgDriver(await asyncpg.connect(url(db))))
    await pgq.install()
    systems["pgqueuer"] = (db, lambda i: pgq.enqueue("bench", payload(i).encode()))
    db = await fresh("insert_breakdown_raw")
    raw = await asyncpg.connect(url(db))
    await raw.execute("CREATE TABLE rawq (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                      "args jsonb NOT NULL, claimed_at timestamptz); CREATE INDEX rawq_ready "
                      "ON rawq (id) WHERE claimed_at IS NULL; CREATE TABLE mini (v int)")
    raw_stmt = await raw.prepare("WITH i AS (INSERT INTO rawq (args) VALUES ($1::jsonb) "
                                 "RETURNING 1) SELECT pg_notify('rawq', '') FROM i")
    mini_stmt = await raw.prepare("INSERT INTO mini VALUES ($1)")
    systems["raw-sql"] = (db, lambda i: raw_stmt.fetchval(payload(i)))
    systems["one-column INSERT"] = (db, lambda i: mini_stmt.fetchval(i))

    async def backend_cpu(db: str) -> float:
        total = 0
        for (pid,) in await admin.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1",
                                        db):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / TICK

    results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in systems}
    for _db, insert in systems.values():  # warm-up: statements prepared, caches filled
        for i in range(50):
            await insert(i)
    for _ in range(args.rounds):
        for name, (db, insert) in systems.items():
            b0, t0, c0 = await backend_cpu(db), time.perf_counter(), time.process_time()
            for i in range(args.n):
                await insert(i)
            t1, c1, b1 = time.perf_counter(), time.process_time(), await backend_cpu(db)
            results[name].append(((t1 - t0) / args.n * 1e6, (c1 - c0) / args.n * 1e6,
                                  (b1 - b0) / args.n * 1e6))
    print("| what | wall µs | client CPU µs | backend CPU µs |\n|---|---:|---:|---:|")
    for name, rows in results.items():
        med = [statistics.median(r[k] for r in rows) for k in range(3)]
        print(f"| {name} | {med[0]:.0f} | {med[1]:.0f} | {med[2]:.0f} |")
    await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=os.path.dirname(HERE))
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    asyncio.run(main(parser.parse_args()))
