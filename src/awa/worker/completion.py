"""Completion: write an attempt's outcome as one lease-guarded statement.

Fourth stop of the pipeline (executor → completion). Completed jobs are
batched: a single flusher takes everything pending, writes it in one
statement (each row still guarded by its own run lease), and repeats, so
batches grow with load and add no delay when idle. Until its batch commits a
job stays ``running`` in the database and keeps being heartbeated; if the
process dies first, rescue re-runs it: never marked done without having run.
Other outcomes are rarer and written one statement each.

A batch waits for no other transaction for long: one that takes longer than
`BATCH_WAIT` is cut short (a row of it is most likely locked: an application
transaction inserting a child ``after=`` a job of the batch holds that job's
row until it commits) and its jobs are written one by one; those still held up
after `ALONE_WAIT` are written alone, in the background, until they go
through. So one open transaction delays only the completion of the job it
holds (which waits for it, as the insert requires), never the others, and
never makes a worker give up a finished job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import asyncpg

from awa.core import validate
from awa.core.model import Outcome
from awa.core.outcomes import OUTCOMES
from awa.core.states import THROUGHPUT_FLUSH_INTERVAL
from awa.db.errors import translated
from awa.db.pool import Conn, HeldConnection
from awa.db.queries import Queries
from awa.enqueue.producer import PreparedJob
from awa.telemetry import otel as telemetry
from awa.telemetry import signals
from awa.telemetry.failures import FailureLog
from awa.worker.followups import insert_followups

log = logging.getLogger("awa.completion")
#: Retries during an outage: the first failure with its traceback, then a line per 30 s.
_failures = FailureLog(log)
RETRY_DELAYS = (0.05, 0.2, 1.0, 2.0, 5.0)
#: A completion batch still running after this long is cut short and written job
#: by job (a normal one takes milliseconds; the statement that finishes a parent
#: releases at most 1,000 of its children itself).
BATCH_WAIT = 5.0
#: How long each job of a cut batch may take before it is written alone, in the
#: background (`Completer.blocked`).
ALONE_WAIT = 2.0


@dataclass(slots=True, eq=False)
class _Pending:
    """A completion waiting for the next flush."""

    lease: int
    output: str | None
    followups: tuple[PreparedJob, ...]
    future: asyncio.Future[bool] | None
    slot: int | None = None  #: a ring attempt's receipt slot (`Job.receipt_slot`)


class Completer:
    """Writes outcomes; batches completions."""

    def __init__(self, pool: asyncpg.Pool, q: Queries, *, completed_retention: timedelta,
                 failed_retention: timedelta, max_batch: int = 512) -> None:
        self._pool = pool
        #: Plain completion batches: one statement at a time, so they keep a connection.
        self._batch: asyncpg.Pool | HeldConnection = pool
        self._q = q
        self._completed_retention = completed_retention
        self._failed_retention = failed_retention
        self._max_batch = max_batch
        self._shard = os.getpid() % 32_000
        self._pending: dict[int, _Pending] = {}
        #: Completions held up by another transaction's lock on their row, written
        #: alone in the background until they go through (see the module's doc).
        self.blocked: dict[int, _Pending] = {}
        self._blocked_task: asyncio.Task[None] | None = None
        self._unblocked = asyncio.Event()  # set while `blocked` is empty
        self._unblocked.set()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.completed = 0
        self.stale = 0
        self.on_flushed: Callable[[], None] | None = None
        self._to_notify: set[str] = set()
        self._counts: dict[tuple[str, bool], int] = {}
        self._waits: dict[str, list[float]] = {}  # queue -> [count, sum ms, max ms]
        self._counts_task: asyncio.Task[None] | None = None
        self._notify_task: asyncio.Task[None] | None = None

    def use_pool(self, pool: asyncpg.Pool, batch_pool: asyncpg.Pool | None = None) -> None:
        """Write through ``pool`` from now on (the runtime's own pool), and plain
        completion batches through ``batch_pool`` (the claim pool, whose plans are
        reused: planning cost as much as the batch itself) when given; the flusher
        keeps one connection of it."""
        self._pool = pool
        self._batch = HeldConnection(batch_pool) if batch_pool is not None else pool

    def start(self) -> None:
        self._task = asyncio.create_task(self._flusher(), name="awa-completer")
        self._counts_task = asyncio.create_task(self._count_flusher(), name="awa-counts")

    def count(self, queue: str, outcome: str) -> None:
        """Count a committed outcome for throughput stats (written every few seconds)."""
        key = (queue, outcome == "completed")
        self._counts[key] = self._counts.get(key, 0) + 1

    def observe_wait(self, queue: str, seconds: float) -> None:
        """Record one pickup latency (claim time minus due time) for the charts."""
        ms = seconds * 1000.0
        w = self._waits.get(queue)
        if w is None:
            self._waits[queue] = [1, ms, ms]
        else:
            w[0] += 1
            w[1] += ms
            if ms > w[2]:
                w[2] = ms

    async def flush_counts(self) -> None:
        if not self._counts and not self._waits:
            return
        counts, self._counts = self._counts, {}
        waits, self._waits = self._waits, {}
        queues = sorted({q for q, _ in counts} | set(waits))
        none = [0, 0.0, 0.0]
        try:
            await self._pool.execute(self._q["throughput_add"], queues,
                                     [counts.get((q, True), 0) for q in queues],
                                     [counts.get((q, False), 0) for q in queues], self._shard,
                                     [int(waits.get(q, none)[0]) for q in queues],
                                     [waits.get(q, none)[1] for q in queues],
                                     [waits.get(q, none)[2] for q in queues])
        except Exception:
            log.warning("could not record throughput counts", exc_info=True)

    async def _count_flusher(self) -> None:
        while True:
            await asyncio.sleep(THROUGHPUT_FLUSH_INTERVAL.total_seconds())
            await self.flush_counts()

    @property
    def queued(self) -> int:
        """Completions waiting for the next flush (the dispatchers' backlog bound)."""
        return len(self._pending)

    def pending(self) -> dict[int, tuple[int, int | None]]:
        """Attempts whose completion is not yet written: id → (run lease, receipt slot)."""
        pending = {job_id: (p.lease, p.slot) for job_id, p in self.blocked.items()}
        pending.update((job_id, (p.lease, p.slot)) for job_id, p in self._pending.items())
        return pending

    def complete(self, job_id: int, lease: int, output_json: str | None = None,
                 followups: Sequence[PreparedJob] = (), *, wait: bool = False,
                 slot: int | None = None) -> asyncio.Future[bool] | None:
        """Queue a completion; it is written by the next flush.

        With follow-ups (or ``wait``), the returned future resolves once the
        batch commits: True if this completion (and its follow-ups) committed,
        False if its lease was stale or the write was given up (the job then
        stays running for rescue). Without, nothing waits (the fast path).
        ``slot``: a ring attempt's receipt slot (`Job.receipt_slot`).
        """
        future = asyncio.get_running_loop().create_future() if followups or wait else None
        self._pending[job_id] = _Pending(lease, output_json, tuple(followups), future, slot)
        self._idle.clear()
        self._wakeup.set()
        return future

    async def drain(self) -> None:
        """Wait until every queued completion is written (or its task stopped)."""
        while self._pending and self._task is not None and not self._task.done():
            await self._idle.wait()
        while self.blocked and self._blocked_task is not None \
                and not self._blocked_task.done():
            await self._unblocked.wait()

    async def stop(self, timeout: float | None = None) -> None:
        """Write what is pending (waiting at most ``timeout`` s), then stop.

        Completions still unwritten after the timeout stay ``running`` in the
        database and are rescued later: never lost, never marked done unrun.
        """
        try:
            await asyncio.wait_for(self.drain(), timeout)
        except TimeoutError:
            log.warning("stopping with %d completions unwritten; rescue will re-run them",
                        len(self._pending))
        if self.blocked:
            log.warning("stopping with %d completions held up by other transactions' locks; "
                        "rescue will re-run them", len(self.blocked))
        for task in (self._task, self._counts_task, self._blocked_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for p in self.blocked.values():
            _resolve(p.future, False)
        await self.flush_counts()
        if isinstance(self._batch, HeldConnection):
            await self._batch.release()

    async def _flusher(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                batch = list(self._pending.items())[: self._max_batch]
                try:
                    await self._flush(batch)
                finally:
                    pending = self._pending
                    for job_id, p in batch:
                        if pending.get(job_id) is p:
                            del pending[job_id]
                        if p.future is not None and self.blocked.get(job_id) is not p:
                            _resolve(p.future, False)
                    if self.on_flushed is not None:
                        self.on_flushed()
                    signals.emit("flush", batch=batch)
            self._idle.set()

    async def _flush(self, batch: list[tuple[int, _Pending]]) -> None:
        ids = [job_id for job_id, _ in batch]
        leases = [p.lease for _, p in batch]
        # The usual batch has no outputs: one NULL to send, not an array of them.
        outputs = [p.output for _, p in batch] if any(p.output is not None for _, p in batch) \
            else None
        # Likewise the receipt slots: NULL when the batch has no ring attempt.
        slots = [p.slot for _, p in batch] if any(p.slot is not None for _, p in batch) \
            else None
        with_followups = any(p.followups for _, p in batch)
        for delay in (*RETRY_DELAYS, None):
            try:
                with translated():
                    if with_followups:
                        rows = await self._flush_with_followups(batch, ids, leases, outputs,
                                                                slots)
                    else:
                        rows = await self._complete_rows(self._batch, ids, leases, outputs,
                                                         slots)
                if any(p.future is not None for _, p in batch):
                    done = {r["id"] for r in rows}
                    for job_id, p in batch:
                        _resolve(p.future, job_id in done)
                self.completed += len(rows)
                self.stale += len(batch) - len(rows)
                counts = self._counts  # count(queue, "completed") per row, inlined
                for r in rows:
                    key = (r["queue"], True)
                    counts[key] = counts.get(key, 0) + 1
                _failures.ok("completion batch write")
                return
            except Exception as exc:
                if _timed_out(exc):
                    # Most likely a row of the batch is locked by an open transaction:
                    # the others must not wait for it.
                    log.warning("a completion batch of %d jobs took over %.0f s (a row locked "
                                "by an open transaction?): writing it job by job", len(batch),
                                BATCH_WAIT)
                    await self._split(batch)
                    return
                if with_followups and not _transient(exc):
                    # A follow-up was rejected: isolate it, one job per transaction.
                    await self._one_by_one(batch)
                    return
                if delay is None:
                    # Still running in the database: heartbeats stop with the
                    # process and rescue re-runs these jobs. Nothing is lost.
                    log.exception("giving up writing %d completions", len(batch))
                    return
                _failures.failed("completion batch write", exc)
                await asyncio.sleep(delay)

    async def _flush_with_followups(self, batch: list[tuple[int, _Pending]], ids: list[int],
                                    leases: list[int], outputs: list[str | None] | None,
                                    slots: list[int | None] | None) -> list[Any]:
        """One transaction: the batch's completions, then the follow-ups of those
        that completed (a stale completion brings none of its follow-ups)."""
        async with self._pool.acquire() as conn:
            await conn.execute(self._q["tx_begin_deferred_notify"])
            try:
                rows = await self._complete_rows(conn, ids, leases, outputs, slots)
                done = {r["id"] for r in rows}
                plain: list[PreparedJob] = []
                for job_id, p in batch:
                    if job_id not in done or not p.followups:
                        continue
                    if any(r.unique_key is not None for r in p.followups):
                        await insert_followups(conn, self._q, p.followups, trigger_id=job_id)
                    else:
                        plain.extend(p.followups)
                if plain:  # pipelined: one round trip for all of them
                    await conn.executemany(self._q["job_insert"],
                                           [r.insert_params() for r in plain])
                await conn.execute("COMMIT")
                telemetry.inserted_jobs(plain)
            except BaseException:
                if _in_transaction(conn):
                    await conn.execute("ROLLBACK")
                raise
        self.notify(r.queue for job_id, p in batch if job_id in done for r in p.followups)
        return rows

    async def _complete_rows(self, db: Conn | asyncpg.Pool | HeldConnection, ids: list[int],
                             leases: list[int], outputs: list[str | None] | None,
                             slots: list[int | None] | None,
                             timeout: float | None = BATCH_WAIT) -> list[Any]:
        """The batch statement's rows (the completions written). A ring attempt whose
        closure lost to a move into the mutable lane committed while the batch waited
        for it is finished there by a second statement, which sees the move (the
        first one's DELETE read awa.jobs before the wait)."""
        keep, mutable = self._completed_retention, self._q["attempt_complete_batch_mutable"]
        if slots is None or all(s is None for s in slots):
            return list(await db.fetch(mutable, ids, leases, outputs, keep, timeout=timeout))
        rows = list(await db.fetch(self._q["attempt_complete_batch"], ids, leases, outputs, keep,
                                   slots, timeout=timeout))
        if len(rows) == len(ids):
            return rows
        done = {r["id"] for r in rows}
        again = [n for n, (i, s) in enumerate(zip(ids, slots, strict=True))
                 if s is not None and i not in done]
        if again:
            rows += await db.fetch(mutable, [ids[n] for n in again], [leases[n] for n in again],
                                   None if outputs is None else [outputs[n] for n in again],
                                   keep, timeout=timeout)
        return rows

    async def _fetch_outcome(self, db: Conn | asyncpg.Pool, sql: str, args: tuple[object, ...],
                             timeout: float | None = None) -> Any:
        """One outcome statement's row (None: stale). A ring attempt's completion that
        lost to a move into the mutable lane is written there (see `_complete_rows`)."""
        if sql == self._q["attempt_complete_batch"]:  # args as `_statement` makes them
            ids, leases, outputs, _keep, slots = args
            rows = await self._complete_rows(db, cast(list[int], ids), cast(list[int], leases),
                                             cast(list[str | None], outputs),
                                             cast(list[int | None], slots), timeout)
            return rows[0] if rows else None
        return await db.fetchrow(sql, *args, timeout=timeout)

    async def _split(self, batch: list[tuple[int, _Pending]]) -> None:
        """A batch cut short, written job by job; a job still held up after
        `ALONE_WAIT` joins `blocked` (its future stays open)."""
        for job_id, p in batch:
            done = await self._complete_alone(job_id, p, ALONE_WAIT)
            if done is None:
                self.blocked[job_id] = p
                self._unblocked.clear()
                if self._blocked_task is None or self._blocked_task.done():
                    self._blocked_task = asyncio.get_running_loop().create_task(
                        self._write_blocked(), name="awa-completer-blocked")
                continue
            _resolve(p.future, done)

    async def _write_blocked(self) -> None:
        """Write the held-up completions alone, each waiting as long as the pool lets
        a statement run, again and again until it goes through: only the job whose
        row is held waits, and a finished job is never given up while the worker
        runs (its row stays ``running`` and heartbeated meanwhile)."""
        delay = 0.05
        try:
            while self.blocked:
                for job_id, p in list(self.blocked.items()):
                    done = await self._complete_alone(job_id, p, None)
                    if done is None:
                        continue
                    del self.blocked[job_id]
                    _resolve(p.future, done)
                    delay = 0.05
                if self.blocked:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
        finally:  # emptied, or this task ended: `drain` stops waiting either way
            self._unblocked.set()

    async def _complete_alone(self, job_id: int, p: _Pending,
                              timeout: float | None) -> bool | None:
        """One completion (with its follow-ups) in its own transaction: whether it was
        written (False: stale lease, or a follow-up rejected, as `write`); None if it
        timed out or failed transiently, to be tried again."""
        sql, args = self._statement(job_id, p.lease, Outcome("completed", output_json=p.output),
                                    None, p.slot)
        try:
            with translated():
                if p.followups:
                    async with self._pool.acquire() as conn:
                        written = await self._write_with_followups(conn, job_id, sql, args,
                                                                   p.followups, timeout)
                    if written:
                        self.notify(r.queue for r in p.followups)
                else:
                    rows = await self._complete_rows(self._pool, [job_id], [p.lease],
                                                     [p.output], [p.slot], timeout)
                    written = bool(rows)
                    for r in rows:
                        self.count(r["queue"], "completed")
        except Exception as exc:
            if _timed_out(exc) or _transient(exc):
                _failures.failed(f"completion of job {job_id}", exc)
                return None
            log.exception("giving up writing the completion of job %d", job_id)
            return False
        _failures.ok(f"completion of job {job_id}")
        if written:
            self.completed += 1
        else:
            self.stale += 1
        return written

    async def _one_by_one(self, batch: list[tuple[int, _Pending]]) -> None:
        for job_id, p in batch:
            ok = await self.write(job_id, p.lease, Outcome("completed", output_json=p.output),
                                  None, p.followups, slot=p.slot)
            _resolve(p.future, ok)
            if ok:
                self.completed += 1

    def _statement(self, job_id: int, lease: int, outcome: Outcome, progress_json: str | None,
                   slot: int | None = None) -> tuple[str, tuple[object, ...]]:
        """The statement that writes ``outcome`` (named by `OUTCOMES`) and its arguments."""
        kind = outcome.kind
        spec = OUTCOMES.get(kind)
        if spec is None or spec.statement is None or (kind == "wait" and outcome.token is None):
            raise ValueError(f"cannot write outcome {kind!r}")
        sql = self._q[spec.statement]
        if outcome.error is not None:  # any outcome's text, as the executor makes a handler's
            outcome = dataclasses.replace(outcome, error=validate.storable_text(outcome.error))
        args: tuple[object, ...]
        if kind == "completed":
            args = ([job_id], [lease], [outcome.output_json], self._completed_retention, [slot])
        elif kind == "retry":
            args = (job_id, lease, outcome.delay, outcome.error, progress_json)
        elif kind == "snooze":
            args = (job_id, lease, outcome.delay, progress_json)
        elif kind == "cancel":
            args = (job_id, lease, outcome.error, self._failed_retention, progress_json)
        elif kind == "fail":
            args = (job_id, lease, outcome.error, self._failed_retention, progress_json,
                    outcome.terminal)
        else:  # wait
            assert outcome.token is not None
            args = (job_id, lease, uuid.UUID(outcome.token), progress_json)
        return sql, args

    async def write(self, job_id: int, lease: int, outcome: Outcome,
                    progress_json: str | None = None,
                    followups: Sequence[PreparedJob] = (), *, slot: int | None = None) -> bool:
        """Write one outcome (with its follow-ups, atomically); False if the lease was stale.

        Transient failures (deadlock, lost connection) retry the whole transaction
        with the same follow-ups; a replay of a commit whose acknowledgement was
        lost finds no running row and inserts nothing. A statement that timed out
        (its row held by an open transaction, most likely) is retried without
        limit: only this job waits, and its outcome is not given up.

        A ring attempt (``slot``: its receipt slot) is moved to the mutable lane
        first, unless it completes: every other outcome is written there.
        """
        sql, args = self._statement(job_id, lease, outcome, progress_json, slot)
        move = slot is not None and outcome.kind != "completed"
        delays = iter((*RETRY_DELAYS, None))
        waited = False
        while True:
            try:
                with translated():
                    if move:
                        await self._pool.execute(self._q["attempt_materialize"], [slot],
                                                 [job_id], [lease])
                        move = False
                    if not followups:
                        row = await self._fetch_outcome(self._pool, sql, args)
                        telemetry.dead_lettered(row)
                        written = row is not None
                    else:
                        async with self._pool.acquire() as conn:
                            written = await self._write_with_followups(conn, job_id, sql,
                                                                       args, followups)
                        if written:
                            self.notify(r.queue for r in followups)
                _failures.ok("outcome write")
                if waited:
                    _failures.ok(f"outcome write of job {job_id}")
                signals.emit("write", job=job_id, written=written)
                return written
            except Exception as exc:
                if _timed_out(exc):
                    waited = True
                    _failures.failed(f"outcome write of job {job_id}", exc)
                    await asyncio.sleep(RETRY_DELAYS[0])
                    continue
                delay = next(delays)
                if delay is None or not _transient(exc):
                    # The job stays running; heartbeats stop and rescue re-runs it.
                    log.exception("giving up writing outcome of job %d", job_id)
                    return False
                _failures.failed("outcome write", exc)
                await asyncio.sleep(delay)


    async def _write_with_followups(self, conn: Conn, job_id: int, sql: str,
                                    args: tuple[object, ...],
                                    followups: Sequence[PreparedJob],
                                    timeout: float | None = None) -> bool:
        # One round trip opens the transaction with wake-ups deferred to after commit.
        await conn.execute(self._q["tx_begin_deferred_notify"])
        try:
            row = await self._fetch_outcome(conn, sql, args, timeout)
            if row is None:
                await conn.execute("ROLLBACK")
                return False
            await insert_followups(conn, self._q, followups, trigger_id=job_id)
            await conn.execute("COMMIT")
            telemetry.dead_lettered(row)
            return True
        except BaseException:
            if _in_transaction(conn):
                await conn.execute("ROLLBACK")
            raise

    def notify(self, queues: Iterable[str]) -> None:
        """Wake the workers of ``queues`` soon (coalesced; sent outside any write)."""
        self._to_notify.update(queues)
        if self._notify_task is None or self._notify_task.done():
            self._notify_task = asyncio.get_running_loop().create_task(self._send_notifies())

    async def _send_notifies(self) -> None:
        while self._to_notify:
            queues, self._to_notify = sorted(self._to_notify), set()
            try:
                await self._pool.execute(self._q["queue_notify"], queues)
            except Exception:
                log.warning("could not notify %s; workers will poll", queues, exc_info=True)


def _resolve(future: asyncio.Future[bool] | None, value: bool) -> None:
    if future is not None and not future.done():  # its waiter may be cancelled (shutdown)
        future.set_result(value)


def _transient(exc: BaseException) -> bool:
    """Worth retrying the same transaction: lost connections, deadlocks, serialization."""
    causes = [exc, exc.__cause__]
    return any(isinstance(c, asyncpg.DeadlockDetectedError | asyncpg.SerializationError
                          | asyncpg.PostgresConnectionError | asyncpg.InterfaceError
                          | asyncpg.InternalClientError
                          | ConnectionError | OSError | TimeoutError)
               or (isinstance(c, asyncpg.PostgresError)
                   and getattr(c, "sqlstate", "").startswith(("08", "57P")))
               for c in causes if c is not None)


def _timed_out(exc: BaseException) -> bool:
    """The statement ran out of time (the driver's timeout, or the server's lock or
    statement timeout): usually a wait for a row another transaction holds."""
    return any(isinstance(c, TimeoutError | asyncpg.QueryCanceledError
                          | asyncpg.LockNotAvailableError)
               for c in (exc, exc.__cause__) if c is not None)


def _in_transaction(conn: Conn) -> bool:
    """Open and inside a transaction (False once the pool took a closed one back)."""
    try:
        return not conn.is_closed() and conn.is_in_transaction()
    except asyncpg.InterfaceError:
        return False
