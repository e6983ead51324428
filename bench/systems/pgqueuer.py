"""Benchmark driver for PgQueuer.

Used as its README recommends: one asyncpg connection wrapped in
``AsyncpgDriver``; schema via ``Queries.install()`` (what ``pgq install`` runs,
durable tables); a ``QueueManager`` with ``run(batch_size=16,
max_concurrent_tasks=32)`` (PgQueuer requires max_concurrent_tasks >= 2 *
batch_size, so 16 is the largest batch for 32 concurrent jobs); single inserts
with ``Queries.enqueue(entrypoint, payload)``, bulk with the list form of
``Queries.enqueue``.

Completion check: PgQueuer deletes a finished job from ``pgqueuer`` and writes
a ``successful`` row to ``pgqueuer_log`` in the same statement.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]

import asyncio  # noqa: E402
import json  # noqa: E402

import asyncpg  # noqa: E402
from pgqueuer.db import AsyncpgDriver  # noqa: E402
from pgqueuer.models import Job  # noqa: E402
from pgqueuer.qm import QueueManager  # noqa: E402
from pgqueuer.queries import Queries  # noqa: E402

sys.path.append(_HERE)
import benchkit  # noqa: E402

ENTRYPOINT = "bench"
BATCH_SIZE = 16


def encode(seq: int, sent_at: float) -> bytes:
    return json.dumps(benchkit.payload(seq, sent_at)).encode()


class Producer:
    def __init__(self, conn) -> None:
        self.conn = conn
        self.queries = Queries(AsyncpgDriver(conn))

    async def insert(self, seq: int, sent_at: float) -> None:
        await self.queries.enqueue(ENTRYPOINT, encode(seq, sent_at))

    async def insert_many(self, seqs: list[int]) -> int:
        ids = await self.queries.enqueue(
            [ENTRYPOINT] * len(seqs), [encode(s, 0.0) for s in seqs], [0] * len(seqs)
        )
        return len(ids)

    async def close(self) -> None:
        await self.conn.close()


class Worker:
    def __init__(self, conn, qm: QueueManager, concurrency: int) -> None:
        self.conn = conn
        self.qm = qm
        self.concurrency = concurrency
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(
            self.qm.run(batch_size=BATCH_SIZE, max_concurrent_tasks=self.concurrency)
        )
        await asyncio.sleep(0)

    async def stop(self) -> None:
        self.qm.shutdown.set()
        if self.task is not None:
            await self.task  # flushes the status-log buffer on the way out

    async def close(self) -> None:
        await self.conn.close()


class System:
    name = "pgqueuer"

    def version(self) -> str:
        from importlib.metadata import version

        return version("pgqueuer")

    async def setup(self, url: str) -> dict:
        conn = await asyncpg.connect(url)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()
        return {}

    async def open_producer(self, url: str) -> Producer:
        return Producer(await asyncpg.connect(url))

    async def open_worker(self, url: str, concurrency: int, on_job) -> Worker:
        conn = await asyncpg.connect(url)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint(ENTRYPOINT)
        async def handle(job: Job) -> None:
            d = json.loads(job.payload)
            on_job(d["seq"], d["sent_at"])

        return Worker(conn, qm, concurrency)

    def counts(self, url: str) -> dict:
        with benchkit.pg_connect(url) as conn:
            log = conn.execute(
                "SELECT status::text, count(*), count(DISTINCT job_id) FROM pgqueuer_log "
                "WHERE entrypoint = %s GROUP BY 1",
                (ENTRYPOINT,),
            ).fetchall()
            queue = conn.execute(
                "SELECT status::text, count(*), count(DISTINCT payload) FROM pgqueuer "
                "WHERE entrypoint = %s GROUP BY 1",
                (ENTRYPOINT,),
            ).fetchall()
        lg = {r[0]: r for r in log}
        q = {r[0]: r for r in queue}
        zero = (None, 0, 0)
        return {
            "method": "sql:pgqueuer_log+pgqueuer",
            "log_states": {r[0]: r[1] for r in log},
            "queue_states": {r[0]: r[1] for r in queue},
            "completed": lg.get("successful", zero)[1],
            "completed_distinct": lg.get("successful", zero)[2],
            "failed": sum(lg.get(s, zero)[1] for s in ("exception", "failed", "canceled")),
            "unfinished": sum(r[1] for r in queue),
            "queued": q.get("queued", zero)[1],
            "queued_distinct": q.get("queued", zero)[2],
        }


if __name__ == "__main__":
    benchkit.main(System())
