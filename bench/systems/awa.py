"""Benchmark driver for Awa (this repo's pure-Python package).

Also serves the ``awa-pg`` system (the Rust-backed SDK on PyPI, same import
name ``awa``): ``awa_pg.py`` loads this file with ``FLAVOR = "awa-pg"``.

Uses only the public client API:
    awa.AsyncClient(url, max_connections=...)
    client.migrate()
    client.insert(BenchJob(...), queue="bench")
    client.enqueue_many_copy([...], queue="bench")  -> int
    @client.task(BenchJob, queue="bench")
    client.start(queues=[("bench", 32)])
    client.shutdown(timeout_ms=...), client.close()
Verification (after the timed part) is a read-only SQL query on the job views.
"""

from __future__ import annotations

import os
import sys

# This file is called awa.py: never let it shadow the library. run.py starts
# drivers with `python -P`, this is the belt to those braces.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]

from dataclasses import dataclass  # noqa: E402
from urllib.parse import urlparse  # noqa: E402

import awa  # noqa: E402

if os.path.abspath(getattr(awa, "__file__", "") or "").startswith(_HERE):
    raise SystemExit("bench/systems/awa.py imported itself instead of the awa package")

sys.path.append(_HERE)
import benchkit  # noqa: E402

FLAVOR = globals().get("FLAVOR", "awa")
QUEUE = "bench"
WORKER_MAX_CONNECTIONS = 10  # the client default
TERMINAL = ("completed", "failed", "cancelled")


@dataclass
class BenchJob:
    seq: int
    sent_at: float = 0.0


class Producer:
    def __init__(self, client) -> None:
        self.client = client

    async def insert(self, seq: int, sent_at: float) -> None:
        await self.client.insert(BenchJob(seq=seq, sent_at=sent_at), queue=QUEUE)

    async def insert_many(self, seqs: list[int]) -> int:
        return await self.client.enqueue_many_copy([BenchJob(seq=s) for s in seqs], queue=QUEUE)

    async def close(self) -> None:
        await self.client.close()


class Worker:
    def __init__(self, client, concurrency: int) -> None:
        self.client = client
        self.concurrency = concurrency

    async def start(self) -> None:
        await self.client.start(queues=[(QUEUE, self.concurrency)])

    async def stop(self) -> None:
        await self.client.shutdown(timeout_ms=5000)

    async def close(self) -> None:
        await self.client.close()


class System:
    name = FLAVOR

    def version(self) -> str:
        try:
            from importlib.metadata import version

            return version("awa-pg" if FLAVOR == "awa-pg" else "awa-queue")
        except Exception:
            return getattr(awa, "__version__", "?")

    async def setup(self, url: str) -> dict:
        client = awa.AsyncClient(url, max_connections=2)
        try:
            await client.migrate()
            info: dict = {}
            # A database migrated from nothing enqueues plain jobs into the append-only
            # lane (migration 0020). BENCH_AWA_MUTABLE: the databases (comma list, e.g.
            # bench_awabase) that enqueue into awa.jobs instead, as a database upgraded
            # from before the ring does, for A/B runs.
            mutable_dbs = os.environ.get("BENCH_AWA_MUTABLE", "").split(",")
            if FLAVOR == "awa":
                db = urlparse(url).path.lstrip("/").removesuffix("_tpl")
                if db in mutable_dbs:
                    await client.set_ring_enqueue(False)
                pool = await client.pool()
                info["ring"] = bool(await pool.fetchval("SELECT enqueue FROM awa.ring"))
            if FLAVOR == "awa-pg":
                # awa-pg 0.6: a fresh database migrates to the "canonical" engine and
                # flips to queue storage (its default engine, which enqueue_many_copy
                # requires) once the first runtime starts. Activate it up front so the
                # pre-inserted jobs land where the workers will look for them.
                import json

                status = json.loads(await client.storage_status())
                if status.get("active_engine") != "queue_storage":
                    await client.install_queue_storage()
                info["engine"] = json.loads(await client.storage_status()).get("active_engine")
            return info
        finally:
            await client.close()

    async def open_producer(self, url: str) -> Producer:
        # Connected before timing, as the protocol asks and the other drivers do
        # (they return an open asyncpg/psycopg connection). AsyncClient opens its
        # pool on first use, so without this the timed part included pool
        # creation (~25 ms in a fresh process: a pooler probe, a connection,
        # codec setup). storage_status() exists in both awa and awa-pg.
        client = awa.AsyncClient(url, max_connections=2)
        await client.storage_status()
        return Producer(client)

    async def open_worker(self, url: str, concurrency: int, on_job) -> Worker:
        client = awa.AsyncClient(url, max_connections=WORKER_MAX_CONNECTIONS)
        # Connected before timing, as open_producer and the other drivers' workers
        # are (an asyncpg connection, procrastinate's open_async); what start()
        # itself does (its own pools, registration) stays in the timed part.
        await client.storage_status()

        @client.task(BenchJob, queue=QUEUE)
        async def handle(job):
            args = job.args
            on_job(args.seq, args.sent_at)
            return None

        return Worker(client, concurrency)

    # ---- verification (read-only, after the timed part) -------------------

    def counts(self, url: str) -> dict:
        with benchkit.pg_connect(url) as conn:
            # our awa: awa.jobs_all (all states); awa-pg: awa.jobs (compat view, all states)
            for rel in ("awa.jobs_all", "awa.jobs"):
                if benchkit.relation_exists(conn, rel):
                    break
            else:
                return self._counts_public_api(url)
            schema, table = rel.split(".")
            idcol = "id" if benchkit.column_exists(conn, schema, table, "id") else "job_id"
            # rel and idcol come from the fixed lists above
            rows = conn.execute(
                f"SELECT state::text, count(*), count(DISTINCT {idcol}), "  # noqa: S608
                f"count(DISTINCT args->>'seq') FROM {rel} WHERE queue = %s GROUP BY 1",
                (QUEUE,),
            ).fetchall()
        by = {r[0]: r for r in rows}
        zero = (None, 0, 0, 0)
        return {
            "method": f"sql:{rel}",
            "states": {r[0]: r[1] for r in rows},
            "completed": by.get("completed", zero)[1],
            "completed_distinct": min(by.get("completed", zero)[2:]),
            "failed": by.get("failed", zero)[1] + by.get("cancelled", zero)[1],
            "unfinished": sum(r[1] for r in rows if r[0] not in TERMINAL),
            "queued": by.get("available", zero)[1],
            "queued_distinct": min(by.get("available", zero)[2:]),
        }

    def _counts_public_api(self, url: str) -> dict:
        """Fallback when no job view exists: queue_stats() (counts only, no distinct check)."""
        import asyncio

        async def go():
            client = awa.AsyncClient(url, max_connections=2)
            try:
                return [s for s in await client.queue_stats() if s.queue == QUEUE]
            finally:
                await client.close()

        stats = asyncio.run(go())
        if not stats:
            return {
                "method": "queue_stats",
                "completed": 0,
                "completed_distinct": 0,
                "failed": 0,
                "unfinished": 0,
                "queued": 0,
                "queued_distinct": 0,
            }
        s = stats[0]
        unfinished = s.available + s.running + s.scheduled + s.retryable + s.waiting_external
        return {
            "method": "queue_stats",
            "completed": s.completed_last_hour,
            "completed_distinct": s.completed_last_hour,
            "failed": s.failed,
            "unfinished": unfinished,
            "queued": s.available,
            "queued_distinct": s.available,
        }


if __name__ == "__main__":
    benchkit.main(System())
