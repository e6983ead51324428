"""Completion: write an attempt's outcome as one lease-guarded statement.

Fourth stop of the pipeline (executor → completion). Completed jobs are
batched: a single flusher takes everything pending, writes it in one
statement (each row still guarded by its own run lease), and repeats, so
batches grow with load and add no delay when idle. Until its batch commits a
job stays ``running`` in the database and keeps being heartbeated; if the
process dies first, rescue re-runs it: never marked done without having run.
Other outcomes are rarer and written one statement each.
"""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import timedelta

import asyncpg

from awa.db.errors import translated
from awa.db.queries import Queries
from awa.executor import Outcome

log = logging.getLogger("awa.completion")
RETRY_DELAYS = (0.05, 0.2, 1.0, 2.0, 5.0)


class Completer:
    """Writes outcomes; batches completions."""

    def __init__(self, pool: asyncpg.Pool, q: Queries, *, completed_retention: timedelta,
                 failed_retention: timedelta, max_batch: int = 512) -> None:
        self._pool = pool
        self._q = q
        self._completed_retention = completed_retention
        self._failed_retention = failed_retention
        self._max_batch = max_batch
        self._shard = os.getpid() % 32_000
        self._pending: dict[int, tuple[int, str | None]] = {}  # id -> (lease, output)
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.completed = 0
        self.stale = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._flusher(), name="awa-completer")

    def pending(self) -> dict[int, int]:
        """Attempts whose completion is not yet written: id → run lease."""
        return {job_id: lease for job_id, (lease, _) in self._pending.items()}

    def complete(self, job_id: int, lease: int, output_json: str | None = None) -> None:
        """Queue a completion; it is written by the next flush."""
        self._pending[job_id] = (lease, output_json)
        self._idle.clear()
        self._wakeup.set()

    async def drain(self) -> None:
        """Wait until every queued completion is written (or its task stopped)."""
        while self._pending and self._task is not None and not self._task.done():
            await self._idle.wait()

    async def stop(self) -> None:
        await self.drain()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _flusher(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                batch = list(self._pending.items())[: self._max_batch]
                await self._flush(batch)
                for job_id, (lease, _) in batch:
                    if self._pending.get(job_id, (None,))[0] == lease:
                        del self._pending[job_id]
            self._idle.set()

    async def _flush(self, batch: list[tuple[int, tuple[int, str | None]]]) -> None:
        ids = [job_id for job_id, _ in batch]
        leases = [lease for _, (lease, _) in batch]
        outputs = [output for _, (_, output) in batch]
        for delay in (*RETRY_DELAYS, None):
            try:
                with translated():
                    rows = await self._pool.fetch(
                        self._q["attempt_complete_batch"], ids, leases, outputs,
                        self._completed_retention, self._shard)
                self.completed += len(rows)
                self.stale += len(batch) - len(rows)
                return
            except Exception:
                if delay is None:
                    # Still running in the database: heartbeats stop with the
                    # process and rescue re-runs these jobs. Nothing is lost.
                    log.exception("giving up writing %d completions", len(batch))
                    return
                log.warning("completion batch failed; retrying in %.2fs", delay, exc_info=True)
                await asyncio.sleep(delay)

    async def park(self, job_id: int, lease: int, callback_id: str,
                   progress_json: str | None) -> bool:
        """The handler returned WaitForCallback: park the job on its callback."""
        import uuid

        with translated():
            row = await self._pool.fetchrow(self._q["callback_park"], job_id, lease,
                                            uuid.UUID(callback_id), progress_json)
        return row is not None

    async def write(self, job_id: int, lease: int, outcome: Outcome,
                    progress_json: str | None = None) -> bool:
        """Write a non-batched outcome; False if the lease was stale."""
        q = self._q
        args: tuple[object, ...]
        if outcome.kind == "retry":
            sql, args = q["attempt_retry"], (job_id, lease, outcome.delay, outcome.error,
                                             progress_json)
        elif outcome.kind == "snooze":
            sql, args = q["attempt_snooze"], (job_id, lease, outcome.delay, progress_json)
        elif outcome.kind == "cancel":
            sql, args = q["attempt_cancel"], (job_id, lease, outcome.error,
                                              self._failed_retention, progress_json)
        elif outcome.kind == "fail":
            sql, args = q["attempt_fail"], (job_id, lease, outcome.error,
                                            self._failed_retention, progress_json, self._shard,
                                            outcome.terminal)
        else:
            raise ValueError(f"outcome {outcome.kind!r} is not written by Completer.write")
        for delay in (*RETRY_DELAYS, None):
            try:
                with translated():
                    row = await self._pool.fetchrow(sql, *args)
                return row is not None
            except Exception:
                if delay is None:
                    log.exception("giving up writing outcome of job %d", job_id)
                    return False
                log.warning("outcome write failed; retrying in %.2fs", delay, exc_info=True)
                await asyncio.sleep(delay)
        return False
