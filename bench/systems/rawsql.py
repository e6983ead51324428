"""Benchmark driver for the raw-SQL ceiling: no framework, no handler.

The cheapest correct at-least-once cycle PostgreSQL allows for a job's
insert → claim → complete, so every other system can be read as a fraction of
it (issue 9, item 1).  asyncpg, prepared statements, and nothing else:

* table ``rawq (id identity primary key, args jsonb, claimed_at timestamptz)``
  plus one partial index ``(id) WHERE claimed_at IS NULL`` (the claim path);
* single insert: one ``INSERT`` that also notifies (``WITH ... SELECT
  pg_notify``), so an idle worker wakes without a trigger;
* bulk insert: binary ``COPY`` plus one ``pg_notify``, in one transaction;
* claim: one statement per batch,
  ``UPDATE rawq SET claimed_at = now() WHERE id IN (SELECT id ... WHERE
  claimed_at IS NULL ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED) RETURNING``;
* the "handler" is the harness's ``on_job`` callback, called inline;
* complete: one ``DELETE ... WHERE id = ANY($1)`` per batch, on a second
  connection, so claims and completions overlap the way a framework's
  dispatcher and completer do.

In-flight rule, as Awa's runtime: at most ``concurrency`` (32) jobs are
claimed and not yet handled; handled jobs wait for the completer, and the
claimer pauses while more than ``max(4 x concurrency, 128)`` completions are
unwritten.  A crash after the claim leaves the row with ``claimed_at`` set;
a reaper (not needed here) would clear ``claimed_at`` older than a timeout,
so nothing is lost.  Everything commits with ``synchronous_commit = on``;
``BENCH_RAWSQL_CLAIM_COMMIT=off`` makes only the claim transactions commit
asynchronously (what Awa's claims did until issue 40; the completion's WAL flush makes
the claim durable too), for comparing like with like.

Verification: completed jobs are deleted, so ``completed`` is the number of
ids ever handed out (the identity sequence of a fresh database) minus the rows
left; run.py checks separately that the handler ran exactly N times.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]

import asyncio  # noqa: E402
import json  # noqa: E402

import asyncpg  # noqa: E402

sys.path.append(_HERE)
import benchkit  # noqa: E402

CLAIM_COMMIT = os.environ.get("BENCH_RAWSQL_CLAIM_COMMIT", "on")
POLL_SECONDS = 0.2  # idle poll, as Awa's default; NOTIFY wakes the worker sooner
MAX_COMPLETE_BATCH = 512

SCHEMA = """
CREATE TABLE rawq (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    args       jsonb NOT NULL,
    claimed_at timestamptz
);
CREATE INDEX rawq_ready ON rawq (id) WHERE claimed_at IS NULL;
"""
INSERT_ONE = (
    "WITH i AS (INSERT INTO rawq (args) VALUES ($1::jsonb) RETURNING 1) "
    "SELECT pg_notify('rawq', '') FROM i"
)
CLAIM = """
UPDATE rawq SET claimed_at = now()
WHERE id IN (SELECT id FROM rawq WHERE claimed_at IS NULL
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, args
"""
COMPLETE = "DELETE FROM rawq WHERE id = ANY($1::bigint[])"


def encode(seq: int, sent_at: float) -> str:
    return json.dumps(benchkit.payload(seq, sent_at))


class Producer:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.stmt = None

    async def insert(self, seq: int, sent_at: float) -> None:
        if self.stmt is None:
            self.stmt = await self.conn.prepare(INSERT_ONE)
        await self.stmt.fetchval(encode(seq, sent_at))

    async def insert_many(self, seqs: list[int]) -> int:
        async with self.conn.transaction():
            await self.conn.copy_records_to_table(
                "rawq", records=[(encode(s, 0.0),) for s in seqs], columns=["args"]
            )
            await self.conn.execute("SELECT pg_notify('rawq', '')")
        return len(seqs)

    async def close(self) -> None:
        await self.conn.close()


class Worker:
    def __init__(self, url: str, concurrency: int, on_job) -> None:
        self.url = url
        self.concurrency = concurrency
        self.on_job = on_job
        self.backlog_limit = max(4 * concurrency, 128)
        self.pending: list[int] = []
        self.wake_claimer = asyncio.Event()
        self.wake_completer = asyncio.Event()
        self.flushed = asyncio.Event()
        self.stopping = False
        self.tasks: list[asyncio.Task] = []

    async def open(self) -> Worker:
        self.claim_conn = await asyncpg.connect(self.url)
        self.done_conn = await asyncpg.connect(self.url)
        if CLAIM_COMMIT == "off":
            await self.claim_conn.execute("SET synchronous_commit = off")
        self.claim = await self.claim_conn.prepare(CLAIM)
        self.complete = await self.done_conn.prepare(COMPLETE)
        return self

    def _notified(self, *_args) -> None:
        self.wake_claimer.set()

    async def start(self) -> None:
        await self.claim_conn.add_listener("rawq", self._notified)
        self.tasks = [
            asyncio.create_task(self._claimer()),
            asyncio.create_task(self._completer()),
        ]

    async def _claimer(self) -> None:
        want = self.concurrency
        loads, on_job, pending = json.loads, self.on_job, self.pending
        while not self.stopping:
            if len(pending) >= self.backlog_limit:
                self.flushed.clear()
                await self.flushed.wait()
                continue
            self.wake_claimer.clear()
            rows = await self.claim.fetch(want)
            for r in rows:
                a = loads(r[1])
                on_job(a["seq"], a["sent_at"])
                pending.append(r[0])
            if rows:
                self.wake_completer.set()
            if len(rows) < want and not self.stopping:
                try:
                    await asyncio.wait_for(self.wake_claimer.wait(), POLL_SECONDS)
                except TimeoutError:
                    pass

    async def _completer(self) -> None:
        while True:
            await self.wake_completer.wait()
            self.wake_completer.clear()
            while self.pending:
                batch = self.pending[:MAX_COMPLETE_BATCH]
                del self.pending[:MAX_COMPLETE_BATCH]
                await self.complete.fetch(batch)
                self.flushed.set()
            self.flushed.set()

    async def stop(self) -> None:
        self.stopping = True
        self.wake_claimer.set()
        self.flushed.set()
        claimer, completer = self.tasks
        await claimer
        while self.pending and not completer.done():
            self.wake_completer.set()
            await asyncio.sleep(0.001)
        completer.cancel()
        await asyncio.gather(completer, return_exceptions=True)
        if self.pending:
            raise RuntimeError(f"{len(self.pending)} completions unwritten")

    async def close(self) -> None:
        for c in (self.claim_conn, self.done_conn):
            await c.close()


class System:
    name = "raw-sql"

    def version(self) -> str:
        return f"asyncpg {asyncpg.__version__}, claim commit {CLAIM_COMMIT}"

    async def setup(self, url: str) -> dict:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(SCHEMA)
        finally:
            await conn.close()
        return {"claim_commit": CLAIM_COMMIT}

    async def open_producer(self, url: str) -> Producer:
        return Producer(await asyncpg.connect(url))

    async def open_worker(self, url: str, concurrency: int, on_job) -> Worker:
        return await Worker(url, concurrency, on_job).open()

    def counts(self, url: str) -> dict:
        with benchkit.pg_connect(url) as conn:
            left, unclaimed, unclaimed_distinct = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE claimed_at IS NULL), "
                "count(DISTINCT args->>'seq') FILTER (WHERE claimed_at IS NULL) FROM rawq"
            ).fetchone()
            seq = conn.execute("SELECT pg_get_serial_sequence('rawq', 'id')").fetchone()[0]
            # seq is the catalog's own (quoted) name of the identity sequence
            last, called = conn.execute(
                f"SELECT last_value, is_called FROM {seq}"  # noqa: S608
            ).fetchone()
        inserted = last if called else 0
        completed = inserted - left
        return {
            "method": "sql:rawq (deleted = ids handed out - rows left)",
            "inserted": inserted,
            "completed": completed,
            "completed_distinct": completed,
            "failed": 0,
            "unfinished": left,
            "queued": unclaimed,
            "queued_distinct": unclaimed_distinct,
        }


if __name__ == "__main__":
    benchkit.main(System())
