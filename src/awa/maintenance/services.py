"""The maintenance services a worker runtime starts beside its dispatchers.

On the leader: promotion, rescue, cleanup, vacuum and the queue gauges; in
every worker process: the release of left-over dependents and the warning
about unserved queues. (The heartbeat is `awa.worker.heartbeat`, leader
election `awa.maintenance.leader`, cron `awa.maintenance.cron`.)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any

import asyncpg

from awa.core.states import (
    DEPENDENCY_RELEASE_CHUNK,
    DEPENDENCY_RETENTION,
    FAILED_RETENTION,
    PARTITION_LOCK_TIMEOUT,
    RUNTIME_STATEMENT_TIMEOUT,
)
from awa.db.queries import Queries, rows_affected
from awa.maintenance.base import PeriodicService, Quarantine, lost_connection
from awa.telemetry import joblog
from awa.telemetry import otel as telemetry
from awa.telemetry.failures import FailureLog

log = logging.getLogger("awa.maintenance")
_failures = FailureLog(log)
PROMOTE_BATCH = 5000
RESCUE_BATCH = 1000
#: A worker seen this recently serves the queues it announced (presence is every 2 s).
UNSERVED_SEEN = timedelta(seconds=30)
#: How often each worker looks for its kinds waiting in queues nobody serves.
UNSERVED_CHECK_INTERVAL = timedelta(seconds=30)
VACUUM_MIN_DEAD = 10_000
#: VACUUM may take longer than the runtime's statement timeout on a big table.
VACUUM_TIMEOUT = 3600.0


class Promoter(PeriodicService):
    """Scheduled and retryable jobs whose time has come become available."""

    name = "promote"

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta,
                 is_leader: Callable[[], bool]) -> None:
        super().__init__(pool, q, interval, is_leader)
        self.promoted = 0

        self.quarantine = Quarantine("promotion")

    async def run_once(self) -> None:
        async def batch(only: list[int] | None, never: list[int]) -> int:
            rows = await self._pool.fetch(self._q["job_promote_due"], PROMOTE_BATCH, only,
                                          never)
            n = sum(r["n"] for r in rows)
            self.promoted += n
            return int(n)

        async def due(never: list[int]) -> list[int]:
            rows = await self._pool.fetch(self._q["job_promote_candidates"], PROMOTE_BATCH,
                                          never)
            return [r["id"] for r in rows]

        await self.quarantine.run(batch, due, PROMOTE_BATCH)


class Rescuer(PeriodicService):
    """Attempts with a stale heartbeat or a passed deadline go back to retryable.

    Each pass first ends the sessions of the runtime's pools (``stalled_sessions``:
    their application names) left waiting for their client mid-statement for longer
    than ``stalled_after`` (statement connection_end_stalled): a half-open connection
    caught between asyncpg's prepare and its execute keeps its transaction, and the
    locks a completion or this rescue needs, for as long as its TCP connection lives;
    no server timeout ends it.
    """

    name = "rescue"

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta,
                 is_leader: Callable[[], bool], *, staleness: timedelta,
                 failed_retention: timedelta,
                 on_rescued: Callable[[list[Any]], Awaitable[None]] | None = None,
                 stalled_sessions: Iterable[str] = (),
                 stalled_after: timedelta = RUNTIME_STATEMENT_TIMEOUT) -> None:
        super().__init__(pool, q, interval, is_leader)
        self._on_rescued = on_rescued
        self._staleness = staleness
        self._failed_retention = failed_retention
        self._stalled_sessions = list(stalled_sessions)
        self._stalled_after = stalled_after
        self.rescued = 0
        #: Stalled sessions of the runtime's pools this rescuer ended.
        self.ended_sessions = 0
        #: Jobs whose rescue fails on its own (one per statement): see `Quarantine`.
        self.quarantines = {"job_rescue_running": Quarantine("rescue"),
                            "callback_rescue_expired": Quarantine("callback rescue")}

    async def run_once(self) -> None:
        """Both statements run whatever the other did, and each one's failure for a
        single job leaves the other jobs' rescue alone (`Quarantine`)."""
        q = self._q
        failed: Exception | None = None
        try:  # first the sessions that may hold what the rest waits for
            await self.end_stalled_sessions()
        except Exception as exc:
            if lost_connection(exc):
                raise
            failed = exc
        try:  # stale ring attempts first move to awa.jobs, where the rescue finds them
            await self._pool.fetchval(q["ring_rescue"], self._staleness, RESCUE_BATCH)
        except Exception as exc:
            if lost_connection(exc):
                raise
            failed = exc
        for name, args, due_name, due_args in (
                ("job_rescue_running", (self._staleness, RESCUE_BATCH, self._failed_retention),
                 "job_rescue_candidates", (self._staleness, RESCUE_BATCH)),
                ("callback_rescue_expired", (RESCUE_BATCH, self._failed_retention),
                 "callback_rescue_candidates", (RESCUE_BATCH,))):
            async def batch(only: list[int] | None, never: list[int], name: str = name,
                            args: tuple[Any, ...] = args) -> int:
                rows = await self._pool.fetch(q[name], *args, only, never)
                await self._record(rows)
                return len(rows)

            async def due(never: list[int], due_name: str = due_name,
                          due_args: tuple[Any, ...] = due_args) -> list[int]:
                return [r["id"] for r in await self._pool.fetch(q[due_name], *due_args, never)]

            try:
                await self.quarantines[name].run(batch, due, RESCUE_BATCH)
            except Exception as exc:
                if lost_connection(exc):
                    raise
                failed = failed or exc
        if failed is not None:
            raise failed

    async def end_stalled_sessions(self) -> int:
        """End the runtime pools' sessions stalled mid-statement (half-open
        connections, see the class); how many."""
        if not self._stalled_sessions:
            return 0
        rows = await self._pool.fetch(self._q["connection_end_stalled"],
                                      self._stalled_sessions, self._stalled_after)
        for r in rows:
            log.warning("ended session %d (%s): it had waited %.0f s for its client in the "
                        "middle of a statement%s (a half-open connection?)", r["pid"],
                        r["application_name"], r["stalled_s"],
                        ", holding a write transaction" if r["in_write"] else "")
        ended = sum(1 for r in rows if r["ended"])
        self.ended_sessions += ended
        return ended

    async def _record(self, rows: list[Any]) -> None:
        self.rescued += len(rows)
        telemetry.rescued(rows)
        for r in rows:
            joblog.rescued(r)
        if rows and self._on_rescued is not None:
            await self._on_rescued(list(rows))


class DependencyReleaser(PeriodicService):
    """Releases the children that the finish of their parent left over (migration 0019).

    The statement that finishes a parent releases at most 1,000 of its
    children; a parent with more is left in ``awa.dependency_releases``. Each
    pass takes those parents in turn (round robin, so one huge fan-out does not
    hold up the others), one chunk of ``chunk_size`` children per statement and
    so per transaction, until none is left. Every worker runs it: a parent
    another worker is releasing is skipped (SKIP LOCKED), and a parent whose
    chunk fails is left for the next pass without stopping the others.
    """

    name = "release"
    leader_only = False

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta,
                 chunk_size: int = DEPENDENCY_RELEASE_CHUNK) -> None:
        super().__init__(pool, q, interval)
        self.chunk_size = chunk_size
        self.released = 0  #: children made available, cancelled or discarded
        self.chunks = 0
        self.failed = 0

    async def run_once(self) -> None:
        q = self._q
        skip: set[int] = set()  # failed, or another worker's, for the rest of this pass
        while True:
            rows = await self._pool.fetch(q["dependency_releases_next"], sorted(skip), 100)
            if not rows:
                return
            for r in rows:
                parent = r["parent_id"]
                try:
                    row = await self._pool.fetchrow(q["dependency_release_one"], parent,
                                                    self.chunk_size)
                except Exception as exc:
                    if lost_connection(exc):
                        raise
                    self.failed += 1
                    _failures.failed(f"release of the children of job {parent}", exc)
                    skip.add(parent)
                    continue
                _failures.ok(f"release of the children of job {parent}")
                if row is None:  # done (its row is gone) or another worker has it
                    skip.add(parent)
                    continue
                self.chunks += 1
                self.released += int(row["touched"])


class Cleaner(PeriodicService):
    """Keeps finished-job partitions rolling and drops the expired ones."""

    name = "cleanup"
    before_jobs = True  # its partitions must exist before the first outcome

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta,
                 is_leader: Callable[[], bool], *, retentions: Iterable[timedelta],
                 batch_size: int, dlq_retention: timedelta,
                 failed_retention: timedelta = FAILED_RETENTION) -> None:
        super().__init__(pool, q, interval, is_leader)
        self._dlq_retention = dlq_retention
        self._failed_retention = failed_retention
        self.orphans_released = 0  #: children of parents deleted by hand, released
        self._retentions = sorted(set(retentions))
        self._lookahead = interval * 2
        self._batch = batch_size
        self.pruned = 0

    async def prepare(self) -> None:
        """The partitions the next finished jobs land in must exist before the first
        completion: rows that land in the default partition keep their hour's
        partition from ever being made, and each later creation scans them."""
        async with self._pool.acquire() as conn:
            await self._ensure_partitions(conn)

    async def _ensure_partitions(self, conn: Any) -> None:
        # Only the hours finished jobs will land in (now + each retention, over
        # the next two passes), one transaction each: creating a partition
        # locks awa.jobs_done, which every completion inserts into. Making all
        # 73 hours up to now + 72 h in one go stalled completions for 8 s
        # (bench/soak.py). And the lock waits at most PARTITION_LOCK_TIMEOUT:
        # queued behind a long reader of awa.jobs_done (a report, a count), it
        # held every completion behind it for that reader's whole run (30 s in
        # the held-xmin harness cell at 2,000/s). A partition not made now is
        # made by the next pass; meanwhile rows land in the default partition.
        timeout = f"{int(PARTITION_LOCK_TIMEOUT.total_seconds() * 1000)}ms"
        missing = await conn.fetch(self._q["done_partitions_missing"], self._retentions,
                                   self._lookahead)
        for (hour,) in missing:
            try:
                async with conn.transaction():
                    await conn.execute(self._q["tx_lock_timeout"], timeout)
                    await conn.execute(self._q["done_partitions_ensure"], hour)
            except asyncpg.LockNotAvailableError:
                log.info("awa.jobs_done is in use; its partition for %s is made later", hour)
                return

    async def run_once(self) -> None:
        q = self._q
        async with self._pool.acquire() as conn:
            await self._ensure_partitions(conn)
            # Expired partitions, one per transaction (each drop locks
            # awa.jobs_done); one whose lock is not granted within 200 ms is
            # left for the next pass (see migration 0007).
            while True:
                try:
                    dropped = await conn.fetchval(q["done_partitions_drop"])
                except asyncpg.LockNotAvailableError:
                    log.info("an expired jobs_done partition is in use; dropping it later")
                    break
                if dropped is None:
                    break
                self.pruned += int(dropped)
            await self._delete_in_batches(conn, "done_default_prune")
            await conn.execute(q["throughput_prune"])
            await conn.execute(q["result_waiters_prune"])
            await conn.execute(q["callback_rules_prune"])
            await self._delete_in_batches(conn, "dlq_prune", self._dlq_retention)
            await self._delete_in_batches(conn, "dependency_prune", DEPENDENCY_RETENTION)
            # Children of a parent deleted by hand (no finish to release them)
            # would wait forever: their on_parent_failure applies instead.
            released = await conn.fetchval(q["dependency_release_orphans"],
                                           self._failed_retention, self._batch,
                                           DEPENDENCY_RELEASE_CHUNK)
            if released:
                log.warning("%d jobs waited for parents that no longer exist (deleted, not "
                            "finished); their on_parent_failure policy was applied", released)
                self.orphans_released += released

    async def _delete_in_batches(self, conn: Any, statement: str, *args: Any) -> None:
        """Run a delete of at most ``batch_size`` rows (its last parameter) until
        one deletes fewer, counting what it pruned."""
        while True:
            status = await conn.execute(self._q[statement], *args, self._batch)
            n = rows_affected(status)
            self.pruned += n
            if n < self._batch:
                break


class Vacuumer(PeriodicService):
    """Vacuums awa.jobs once dead tuples pile up, whatever autovacuum does.

    Every job leaves dead row versions behind (claim, then delete). Until they
    are vacuumed, claims walk past their index entries: with autovacuum off or
    behind, claims slowed from 1 ms to 300 ms within seconds at 5,000 jobs/s
    (bench/soak.py). The check is one read of pg_stat_user_tables.
    """

    name = "vacuum"

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta,
                 is_leader: Callable[[], bool]) -> None:
        super().__init__(pool, q, interval, is_leader)
        self.vacuums = 0

    async def run_once(self) -> None:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(self._q["jobs_dead_tuples"])
            if row is None or row["dead"] < max(VACUUM_MIN_DEAD, row["live"] // 5):
                return
            try:
                await conn.execute(self._q["jobs_vacuum"], timeout=VACUUM_TIMEOUT)
                self.vacuums += 1
            except Exception as exc:  # e.g. a runtime role that does not own the table
                log.warning("could not vacuum awa.jobs (%d dead tuples): %s", row["dead"], exc)


class UnservedQueueWarner(PeriodicService):
    """Warns, once per kind and queue, about jobs of this worker's kinds waiting in
    queues no live worker serves (an insert that named the wrong queue, say)."""

    name = "unserved"
    leader_only = False

    def __init__(self, pool: asyncpg.Pool, q: Queries, interval: timedelta,
                 kinds: Callable[[], list[str]]) -> None:
        super().__init__(pool, q, interval)
        self._kinds = kinds
        self.warned: set[tuple[str, str]] = set()

    async def run_once(self) -> None:
        kinds = self._kinds()
        if not kinds:
            return
        rows = await self._pool.fetch(self._q["queue_unserved_kinds"], kinds, UNSERVED_SEEN)
        for r in rows:
            if (r["kind"], r["queue"]) in self.warned:
                continue
            self.warned.add((r["kind"], r["queue"]))
            log.warning("jobs of kind %r wait in queue %r, which no running worker serves "
                        "(this worker handles %r: serve that queue, or insert with queue=...)",
                        r["kind"], r["queue"], r["kind"])


class QueueGauges(PeriodicService):
    """On the leader, refreshes the cached queue depth and lag that the gauges report.

    One grouped count of the active table per interval, and only while metrics
    are on; a process that stops leading stops reporting once its copy is stale.
    """

    name = "queue_gauges"

    def __init__(self, pool: asyncpg.Pool, q: Queries, is_leader: Callable[[], bool],
                 interval: timedelta = telemetry.QUEUE_GAUGE_INTERVAL) -> None:
        super().__init__(pool, q, interval, is_leader)

    async def run_once(self) -> None:
        if telemetry.metrics_on():
            telemetry.record_queue_snapshot(await self._pool.fetch(self._q["queue_depth_lag"]))
