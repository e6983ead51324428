"""The leader's batch-operation runner (see `awa.batch`).

Each step is one short transaction holding the operation's step lock: start
(pending → scanning), snapshot the next ids (scanning → running when done),
or act on the next chunk of the snapshot and count it (running → completed
when none is left). A cancel never waits for a step: the operation stops
at the next one. A
transient database error leaves the operation for the next pass; any other
error fails it with ``last_error``, except inside a chunk, where the chunk is
retried one job at a time and only the jobs that fail count as errored.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import asyncpg

from awa.core import batch_spec as batch
from awa.core import serialize
from awa.db.pool import Conn
from awa.db.queries import Queries
from awa.maintenance.base import PeriodicService

log = logging.getLogger("awa.maintenance")
DEFAULT_CHUNK = 500
SCAN_WINDOW = 10_000  #: job ids looked at per snapshot step
ACTIVE_PER_PASS = 20
PRUNE_BATCH = 1000
#: Errors that say "try again later", not "this operation cannot work".
TRANSIENT = (asyncpg.TransactionRollbackError, asyncpg.LockNotAvailableError,
             asyncpg.OperatorInterventionError, asyncpg.PostgresConnectionError,
             asyncpg.InsufficientResourcesError, asyncpg.InterfaceError, OSError, TimeoutError)


def _queue_free_unique_ids(rows: list[Any]) -> list[int]:
    """The unique jobs whose key leaves the queue out, so moving them keeps it valid.

    A key made with ``by_queue`` (or ``by_period``, whose bucket is not
    stored) does not match either recomputation; such jobs stay put.
    """
    movable = []
    for r in rows:
        key = bytes(r["unique_key"])
        if any(serialize.unique_key(r["kind"], r["queue"], r["args"], False, by_args, None) == key
               for by_args in (True, False)):
            movable.append(r["id"])
    return movable


class BatchRunner(PeriodicService):
    """Runs pending batch operations to completion, oldest first."""

    name = "batch"

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta,
                 is_leader: Callable[[], bool], *, instance_id: str,
                 chunk_size: int = DEFAULT_CHUNK) -> None:
        super().__init__(pool, q, interval, is_leader)
        self._instance = instance_id
        self.chunk_size = chunk_size
        self._stopping: asyncio.Event | None = None
        self.chunks = 0

    async def run(self, stopping: asyncio.Event) -> None:
        self._stopping = stopping
        await super().run(stopping)

    def _may_continue(self) -> bool:
        stopping = self._stopping is not None and self._stopping.is_set()
        return not stopping and (not self.leader_only or self._is_leader())

    async def run_once(self) -> None:
        async with self._pool.acquire() as conn:
            await conn.fetchval(self._q["batch_prune_expired"], PRUNE_BATCH)
            for row in await conn.fetch(self._q["batch_active"], ACTIVE_PER_PASS):
                while self._may_continue() and await self._guarded_step(conn, row["id"]):
                    pass

    async def _guarded_step(self, conn: Conn, op_id: uuid.UUID) -> bool:
        try:
            return await self.step(conn, op_id)
        except TRANSIENT:
            raise
        except Exception as exc:
            log.warning("batch operation %s failed", op_id, exc_info=True)
            await conn.fetchrow(self._q["batch_finish"], op_id, "failed", batch.RETENTION,
                                _describe(exc))
            return False

    async def step(self, conn: Conn, op_id: uuid.UUID) -> bool:
        """One transaction of work on ``op_id``; False when there is nothing more to do."""
        q = self._q
        async with conn.transaction():
            await conn.execute(q["batch_step_lock"], op_id)
            op = await conn.fetchrow(q["batch_get"], op_id)  # read after the lock: current
            if op is None or op["state"] in batch.TERMINAL_STATES:
                return False
            if op["state"] == "cancelling":
                await conn.fetchrow(q["batch_finish"], op_id, "cancelled", batch.RETENTION, None)
                return False
            if op["state"] == "pending":
                await conn.execute(q["batch_start"], op_id, self._instance)
                return True
            f = batch.parse_filter(op["filter"])
            if op["state"] == "scanning":
                return await self._scan(conn, op_id, op["cursor"], f)
            return await self._chunk(conn, op_id, op["spec"], f)

    async def _scan(self, conn: Conn, op_id: uuid.UUID, cursor: Mapping[str, Any],
                    f: batch.Filter) -> bool:
        q = self._q
        last = int(cursor["max_job_id"])
        scanned_to = await conn.fetchval(q["batch_scan"], *f.params(), op_id,
                                         int(cursor["after_job_id"]), last, SCAN_WINDOW)
        if scanned_to is None or scanned_to >= last:
            await conn.execute(q["batch_scanned"], op_id, self._instance)
        else:
            await conn.execute(q["batch_scan_progress"], op_id, scanned_to, self._instance)
        return True

    async def _chunk(self, conn: Conn, op_id: uuid.UUID, spec: Mapping[str, Any],
                     f: batch.Filter) -> bool:
        q = self._q
        ids = [r["job_id"] for r in await conn.fetch(q["batch_chunk"], op_id, self.chunk_size)]
        if not ids:
            await conn.fetchrow(q["batch_finish"], op_id, "completed", batch.RETENTION, None)
            return False
        priority, queue = batch.spec_params(spec)
        movable: list[int] = []
        if queue is not None:
            movable = _queue_free_unique_ids(await conn.fetch(q["batch_chunk_unique"], ids))
        params = (*f.params(), ids, priority, queue, movable)
        errored, last_error = 0, None
        try:
            async with conn.transaction():  # a savepoint: a failure leaves the chunk to retry
                processed = await self._apply(conn, params)
        except TRANSIENT:
            raise
        except asyncpg.PostgresError as exc:
            log.warning("batch operation %s: chunk failed (%s); retrying job by job", op_id, exc)
            processed = 0
            for job_id in ids:
                try:
                    async with conn.transaction():
                        processed += await self._apply(conn, (*params[:7], [job_id],
                                                              *params[8:]))
                except TRANSIENT:
                    raise
                except asyncpg.PostgresError as job_exc:
                    errored += 1
                    last_error = f"job {job_id}: {_describe(job_exc)}"
        await conn.execute(q["batch_chunk_done"], op_id, ids, processed,
                           len(ids) - processed - errored, errored, last_error, self._instance)
        self.chunks += 1
        return True

    async def _apply(self, conn: Conn, params: tuple[Any, ...]) -> int:
        row = await conn.fetchrow(self._q["batch_apply"], *params)
        assert row is not None
        return int(row["processed"])


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}"[:2000] if text else type(exc).__name__
