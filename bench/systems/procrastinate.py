"""Benchmark driver for Procrastinate.

Used as its docs recommend: ``App(connector=PsycopgConnector(...))`` (the
default async connector, psycopg 3 pool, here max_size=10 to match the other
systems' 10-connection pools), schema via ``app.schema_manager.apply_schema_async()``
(what ``procrastinate schema --apply`` runs), a worker via
``app.run_worker_async(queues=["bench"], concurrency=32)`` with the defaults
(LISTEN/NOTIFY on, jobs kept after completion), single inserts with
``task.defer_async(...)``, bulk with ``task.batch_defer_async(...)``.
Stopping = cancelling the run_worker_async task, which procrastinate turns into
a graceful stop.

Completion check: ``procrastinate_jobs.status = 'succeeded'``.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]

import asyncio  # noqa: E402
import contextlib  # noqa: E402

import procrastinate  # noqa: E402

sys.path.append(_HERE)
import benchkit  # noqa: E402

QUEUE = "bench"
POOL_MAX = 10


def make_app(url: str, max_size: int):
    return procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=url, min_size=min(2, max_size), max_size=max_size
        )
    )


class Producer:
    def __init__(self, app, task) -> None:
        self.app = app
        self.task = task

    async def insert(self, seq: int, sent_at: float) -> None:
        await self.task.defer_async(seq=seq, sent_at=sent_at)

    async def insert_many(self, seqs: list[int]) -> int:
        ids = await self.task.batch_defer_async(*({"seq": s, "sent_at": 0.0} for s in seqs))
        return len(ids)

    async def close(self) -> None:
        await self.app.close_async()


class Worker:
    def __init__(self, app, concurrency: int) -> None:
        self.app = app
        self.concurrency = concurrency
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(
            self.app.run_worker_async(
                queues=[QUEUE],
                concurrency=self.concurrency,
                wait=True,
                install_signal_handlers=False,
            )
        )
        await asyncio.sleep(0)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def close(self) -> None:
        await self.app.close_async()


def define_task(app, on_job=None):
    @app.task(name="bench", queue=QUEUE)
    async def bench(seq: int, sent_at: float = 0.0) -> None:
        if on_job is not None:
            on_job(seq, sent_at)

    return bench


class System:
    name = "procrastinate"

    def version(self) -> str:
        from importlib.metadata import version

        return version("procrastinate")

    async def setup(self, url: str) -> dict:
        app = make_app(url, 2)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
        return {}

    async def open_producer(self, url: str) -> Producer:
        app = make_app(url, 2)
        task = define_task(app)
        await app.open_async()
        return Producer(app, task)

    async def open_worker(self, url: str, concurrency: int, on_job) -> Worker:
        app = make_app(url, POOL_MAX)
        define_task(app, on_job)
        await app.open_async()
        return Worker(app, concurrency)

    def counts(self, url: str) -> dict:
        with benchkit.pg_connect(url) as conn:
            rows = conn.execute(
                "SELECT status::text, count(*), count(DISTINCT id), count(DISTINCT args->>'seq') "
                "FROM procrastinate_jobs WHERE queue_name = %s GROUP BY 1",
                (QUEUE,),
            ).fetchall()
        by = {r[0]: r for r in rows}
        zero = (None, 0, 0, 0)
        return {
            "method": "sql:procrastinate_jobs",
            "states": {r[0]: r[1] for r in rows},
            "completed": by.get("succeeded", zero)[1],
            "completed_distinct": min(by.get("succeeded", zero)[2:]),
            "failed": sum(by.get(s, zero)[1] for s in ("failed", "cancelled", "aborted")),
            "unfinished": sum(by.get(s, zero)[1] for s in ("todo", "doing", "aborting")),
            "queued": by.get("todo", zero)[1],
            "queued_distinct": min(by.get("todo", zero)[2:]),
        }


if __name__ == "__main__":
    benchkit.main(System())
