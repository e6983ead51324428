"""Inspection and basic admin: read jobs and queues, cancel, retry, pause, drain.

Each function takes a connection (or pool) and the bound `Queries`; the
clients expose them as methods. Transitions are single statements, so an
admin action and a worker racing on the same job serialize on its row.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import asyncpg

from awa.core import serialize, states, validate
from awa.core.errors import JobNotFound, ValidationError
from awa.core.model import Job, KeyStat, QueueStat, RetryFailedResult
from awa.core.states import JobState
from awa.db.errors import translated
from awa.db.pool import Conn
from awa.db.queries import Queries, rows_affected

Executor = asyncpg.Connection | asyncpg.Pool


async def get_job(db: Executor, q: Queries, job_id: int) -> Job:
    """The job with ``job_id`` wherever it lives; `JobNotFound` if none."""
    validate.check_id("job_id", job_id)
    with translated():
        row = await db.fetchrow(q["job_get"], job_id)
    if row is None:
        raise JobNotFound(f"job {job_id} not found")
    return Job.from_row(row)


async def list_jobs(db: Executor, q: Queries, *, state: JobState | str | None = None,
                    kind: str | None = None, queue: str | None = None,
                    limit: int = 100) -> list[Job]:
    """Newest first, filtered by state, kind and queue."""
    limit = validate.check_int("limit", limit, 1, 10_000)
    kind = validate.check_name("kind", kind) if kind is not None else None
    queue = validate.check_name("queue", queue) if queue is not None else None
    with translated():
        if state is None:
            rows = await db.fetch(q["job_list_any"], kind, queue, limit)
        else:
            parsed = JobState.parse(state)
            name = ("job_list_active" if parsed not in states.TERMINAL
                    else "job_list_finished" if parsed is JobState.Completed
                    else "job_list_unsuccessful")
            rows = await db.fetch(q[name], parsed.value, kind, queue, limit)
    return [Job.from_row(r) for r in rows]


async def dump_job(db: Executor, q: Queries, job_id: int) -> str:
    """Every field of a job as pretty JSON, for support and debugging."""
    job = await get_job(db, q, job_id)
    return json.dumps(job.to_dict(), indent=2, sort_keys=True, default=str)


async def cancel(db: Executor, q: Queries, job_id: int, *,
                 retention: timedelta = states.FAILED_RETENTION) -> Job | None:
    """Cancel an unfinished job (a running handler is told); None if already finished.

    A job in the append-only lane moves to awa.jobs first (a statement of its
    own, so the cancel sees it), where the cancel and its ``awa_cancel`` notice
    to a running handler work as for any job.
    """
    validate.check_id("job_id", job_id)
    with translated():
        await db.fetchval(q["job_ring_to_mutable"], [job_id])
        row = await db.fetchrow(q["job_cancel"], job_id, retention)
    if row is None:
        await get_job(db, q, job_id)  # raises JobNotFound for an unknown id
        return None
    return Job.from_row(row)


async def cancel_by_unique_key(db: Executor, q: Queries, kind: str, *, queue: str | None = None,
                               args: Any = None, period_bucket: int | None = None,
                               retention: timedelta = states.FAILED_RETENTION) -> Job | None:
    """Cancel the unfinished job holding the key these inputs hash to, if any."""
    validate.check_name("kind", kind)
    if queue is not None:
        validate.check_name("queue", queue)
    if period_bucket is not None:
        validate.check_int("period_bucket", period_bucket, validate.ID_MIN, validate.ID_MAX)
    by_args = args is not None
    args_dict = serialize.args_to_dict(args)[1] if by_args else {}
    if by_args:
        serialize.dumps(args_dict, "args")
    key = serialize.unique_key(kind, queue or "", args_dict, queue is not None, by_args,
                              period_bucket)
    with translated():
        row = await db.fetchrow(q["job_cancel_by_unique_key"], key, queue, retention)
    return Job.from_row(row) if row is not None else None


async def retry(db: Executor, q: Queries, job_id: int) -> Job:
    """Send a failed, cancelled or callback-waiting job back to available, attempt 0."""
    validate.check_id("job_id", job_id)
    with translated():
        row = await db.fetchrow(q["job_retry_finished"], job_id)
        if row is None:
            row = await db.fetchrow(q["job_retry_waiting"], job_id)
    if row is None:
        job = await get_job(db, q, job_id)
        raise ValidationError("job", f"job {job_id} is {job.state}; only failed, cancelled "
                              "or waiting_external jobs can be retried")
    return Job.from_row(row)


async def pause_queue(db: Executor, q: Queries, queue: str, paused_by: str | None = None) -> None:
    """Stop claiming from ``queue`` (inserts still succeed)."""
    validate.check_name("queue", queue)
    if paused_by is not None:
        validate.check_text("paused_by", paused_by)
    with translated():
        await db.execute(q["queue_pause"], queue, paused_by)


async def queue_known(db: Executor, q: Queries, queue: str) -> bool:
    """Whether ``queue`` is known: it has a switch row, jobs (active, failed, recently
    finished or dead-lettered), an override, a descriptor, a worker or a cron schedule."""
    validate.check_name("queue", queue)
    with translated():
        return bool(await db.fetchval(q["queue_known"], queue))


async def resume_queue(db: Executor, q: Queries, queue: str) -> None:
    """Claim from ``queue`` again."""
    validate.check_name("queue", queue)
    with translated():
        await db.execute(q["queue_resume"], queue)


async def drain_queue(db: Executor, q: Queries, queue: str, *,
                      retention: timedelta = states.FAILED_RETENTION) -> int:
    """Cancel every job of ``queue`` waiting to run or on a callback; returns how many.

    The queue's available ring jobs move to awa.jobs first (their own
    statement), where the drain cancels them with the rest.
    """
    validate.check_name("queue", queue)
    with translated():
        await db.fetchval(q["job_ring_queue_to_mutable"], queue)
        status = await db.execute(q["queue_drain"], queue, retention)
    return rows_affected(status)


async def queue_stats(db: Executor, q: Queries) -> list[QueueStat]:
    """Counts per state, completions in the last hour, lag and pause, per queue."""
    with translated():
        rows = await db.fetch(q["queue_stats"])
    return [QueueStat(
        queue=r["queue"], scheduled=r["scheduled"], available=r["available"],
        retryable=r["retryable"], running=r["running"], failed=r["failed"],
        waiting_external=r["waiting_external"], completed_last_hour=r["completed_last_hour"],
        lag_seconds=r["lag_seconds"], paused=r["paused"],
        total_queued=r["scheduled"] + r["available"] + r["retryable"],
    ) for r in rows]


async def concurrency_keys(db: Executor | Conn, q: Queries, queue: str | None = None,
                           limit: int = states.KEY_STATS_LIMIT_DEFAULT) -> list[KeyStat]:
    """Concurrency keys with jobs in flight, saturated first (at most ``limit``)."""
    if queue is not None:
        validate.check_name("queue", queue)
    validate.check_int("limit", limit, 1, states.KEY_STATS_LIMIT_MAX)
    with translated():
        rows = await db.fetch(q["concurrency_key_stats"], queue, limit, states.KEY_WAITING_CAP)
    return [KeyStat(queue=r["queue"], key=r["key"], running=r["running"],
                    in_flight=r["in_flight"], max_in_flight=r["max_in_flight"],
                    waiting=r["waiting"],
                    waiting_at_least=r["waiting"] >= states.KEY_WAITING_CAP,
                    saturated=r["saturated"]) for r in rows]


async def retry_failed(db: Executor, q: Queries, *, kind: str | None = None,
                       queue: str | None = None) -> RetryFailedResult:
    """Every failed job of one kind, or one queue, back to available (attempt 0)."""
    if (kind is None) == (queue is None):
        raise ValidationError("kind/queue", "specify exactly one of kind or queue")
    with translated():
        rows = await db.fetch(q["job_retry_failed_bulk"],
                              validate.check_name("kind", kind) if kind is not None else None,
                              validate.check_name("queue", queue) if queue is not None else None)
    jobs = [Job.from_row(r) for r in rows]
    return RetryFailedResult(jobs=jobs, matched=len(jobs))


async def discard_failed(db: Executor, q: Queries, kind: str) -> int:
    """Delete the failed jobs of ``kind``."""
    validate.check_name("kind", kind)
    with translated():
        status = await db.execute(q["job_discard_failed"], kind)
    return rows_affected(status)


async def dump_run(db: Executor, q: Queries, job_id: int, attempt: int | None = None) -> str:
    """One attempt, reconstructed from the job row and the error it recorded."""
    job = await get_job(db, q, job_id)
    attempt = job.attempt if attempt is None else validate.check_int("attempt", attempt, 1,
                                                                     states.MAX_ATTEMPTS_MAX)
    if attempt < 1 or attempt > max(job.attempt, 1):
        raise ValidationError("attempt", f"job {job_id} has run {job.attempt} attempt(s)")
    errors = [e for e in job.errors if e.get("attempt") == attempt]
    latest = attempt == job.attempt
    run = {
        "job_id": job.id, "kind": job.kind, "queue": job.queue, "attempt": attempt,
        "attempts_so_far": job.attempt, "max_attempts": job.max_attempts, "args": job.args,
        "error": errors[-1]["error"] if errors else None,
        "failed_at": errors[-1]["at"] if errors else None,
        "terminal": bool(errors and errors[-1].get("terminal")),
        "outcome": ("errored" if errors else str(job.state) if latest else "unknown"),
        "state_now": str(job.state),
        "attempted_at": job.attempted_at.isoformat() if latest and job.attempted_at else None,
        "progress": job.progress if latest else None,
    }
    return json.dumps(run, indent=2, default=str)
